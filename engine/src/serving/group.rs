//! One checkpoint's queue and batch inside the executor.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use switchyard_kernels::Backend;

use super::checkpoint::{CheckpointHandle, ServedCheckpoint};
use super::choice::Claim;
use super::queue::{SequenceEvent, SequenceRequest};
use super::sequence::Sequence;
use crate::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};

/// A request waiting for a batch slot.
pub(super) struct Waiting {
    pub(super) request: SequenceRequest,
    pub(super) arrived: Instant,
}

/// The work of one checkpoint: requests waiting, sequences running.
pub(super) struct Group<B: Backend> {
    pub(super) checkpoint: CheckpointHandle<B>,
    pub(super) waiting: VecDeque<Waiting>,
    active: Vec<Sequence<B>>,
    /// When it last ran a step (or when its first request came).
    last_run: Instant,
}

impl<B: Backend> Group<B> {
    pub(super) fn new(checkpoint: CheckpointHandle<B>, since: Instant) -> Self {
        Group {
            checkpoint,
            waiting: VecDeque::new(),
            active: Vec::new(),
            last_run: since,
        }
    }

    pub(super) fn active_len(&self) -> usize {
        self.active.len()
    }

    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Drops sequences whose client went away, freeing their caches now.
    pub(super) fn drop_cancelled(&mut self) {
        let checkpoint = &self.checkpoint;
        self.active.retain(|sequence| {
            let keep = !sequence.is_cancelled();
            if !keep {
                checkpoint.finished();
            }
            keep
        });
    }

    /// Moves the oldest waiting request into the batch with a KV cache.
    /// Returns whether it now holds a slot (false if its client left or
    /// its cache could not be allocated, which it is told).
    pub(super) fn admit_front(&mut self, backend: &B) -> bool {
        let Some(Waiting { mut request, .. }) = self.waiting.pop_front() else {
            return false;
        };
        self.checkpoint.admitted();
        if request.sink.is_closed() {
            self.checkpoint.finished();
            return false;
        }
        let model = &self.checkpoint.model;
        let context = model.config().context_length;
        let wanted = request.stop.max_tokens.unwrap_or(context);
        let capacity = request.prompt.len().saturating_add(wanted).min(context);
        match model.new_cache(backend, capacity) {
            Ok(cache) => {
                self.active.push(Sequence::new(request, cache, capacity));
                true
            }
            Err(e) => {
                request.sink.send(SequenceEvent::Error(format!(
                    "cannot allocate a KV cache of {capacity} tokens: {e}"
                )));
                self.checkpoint.finished();
                false
            }
        }
    }

    /// This checkpoint's claim on the next step.
    pub(super) fn claim(
        &self,
        max_step_tokens: usize,
        current: Option<&Arc<ServedCheckpoint<B>>>,
    ) -> Claim {
        let rows = self
            .plan(max_step_tokens)
            .iter()
            .flatten()
            .map(|span| span.len())
            .sum();
        let deadline = self
            .active
            .iter()
            .filter_map(Sequence::deadline)
            .chain(self.waiting.iter().filter_map(|w| w.request.deadline))
            .min();
        Claim {
            waiting_since: self.last_run,
            rows,
            deadline,
            current: current.is_some_and(|c| Arc::ptr_eq(c, &self.checkpoint)),
        }
    }

    /// One forward pass over the batch with `model` (the weight table the
    /// executor swapped in), then sampling. Returns rows and sequences run.
    pub(super) fn step(
        &mut self,
        backend: &B,
        model: &LlamaModel<B>,
        scratch: &mut Scratch<B>,
        max_step_tokens: usize,
    ) -> (usize, usize) {
        self.last_run = Instant::now();
        let spans = self.plan(max_step_tokens);
        let mut chunks = Vec::with_capacity(self.active.len());
        for (sequence, span) in self.active.iter_mut().zip(&spans) {
            let Some(span) = span else { continue };
            let wants_logits = span.end == sequence.tokens.len();
            chunks.push(SequenceChunk {
                // `plan` keeps spans inside `tokens`; empty if it ever did not.
                tokens: sequence.tokens.get(span.clone()).unwrap_or_default(),
                start_pos: span.start,
                cache: &mut sequence.cache,
                logits: if wants_logits {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
            });
        }
        let rows: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let sequences = chunks.len();
        if chunks.is_empty() {
            return (0, 0);
        }
        let result = model.forward(backend, &mut chunks, scratch);
        drop(chunks);
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // Which sequence caused it is unknown; fail the whole batch
                // rather than loop on the same error.
                for sequence in &mut self.active {
                    sequence.fail(format!("the forward pass failed: {e}"));
                    self.checkpoint.finished();
                }
                self.active.clear();
                return (rows, sequences);
            }
        };

        let vocab = model.config().vocab_size;
        let mut logit_rows = logits.chunks_exact(vocab);
        let mut keep = Vec::with_capacity(self.active.len());
        for (sequence, span) in self.active.iter_mut().zip(spans) {
            let Some(span) = span else {
                keep.push(true);
                continue;
            };
            sequence.processed = span.end;
            if span.end < sequence.tokens.len() {
                keep.push(true);
                continue;
            }
            let goes_on = match logit_rows.next() {
                Some(row) => sequence.accept_logits(row),
                None => {
                    sequence.fail("the forward pass returned fewer logits rows than asked".into());
                    false
                }
            };
            keep.push(goes_on);
        }
        let mut keep = keep.into_iter();
        let checkpoint = &self.checkpoint;
        self.active.retain(|_| {
            let goes_on = keep.next().unwrap_or(false);
            if !goes_on {
                checkpoint.finished();
            }
            goes_on
        });
        (rows, sequences)
    }

    /// The tokens each sequence runs next step: one for each decoding
    /// sequence, then prompt chunks in arrival order within the step budget.
    fn plan(&self, max_step_tokens: usize) -> Vec<Option<Range<usize>>> {
        let decoding = self.active.iter().filter(|s| s.is_decoding()).count();
        let mut budget = max_step_tokens.max(1).saturating_sub(decoding);
        self.active
            .iter()
            .map(|sequence| {
                if sequence.is_decoding() {
                    return Some(sequence.next_span(1));
                }
                if budget == 0 {
                    return None;
                }
                let span = sequence.next_span(budget);
                budget -= span.len();
                Some(span)
            })
            .collect()
    }
}
