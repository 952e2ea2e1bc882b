//! One checkpoint's queue and batch inside the executor.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use switchyard_kernels::Backend;

use super::checkpoint::CheckpointHandle;
use super::choice::Claim;
use super::queue::{SequenceEvent, SequenceRequest};
use super::sequence::Sequence;
use crate::model::{LogitRows, SequenceChunk};

/// Positions a sequence's cache may grow to: prompt plus `max_tokens`, never past
/// the context.
pub(super) fn cache_positions(prompt: usize, max_tokens: Option<usize>, context: usize) -> usize {
    prompt
        .saturating_add(max_tokens.unwrap_or(context))
        .min(context)
}

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

    /// KV bytes the running sequences may grow to, together.
    pub(super) fn kv_bytes_held(&self) -> usize {
        let per_position = super::executor::kv_bytes_per_position(self.checkpoint.model.config());
        self.active
            .iter()
            .map(|s| s.capacity().saturating_mul(per_position))
            .sum()
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
        let capacity = cache_positions(
            request.prompt.len(),
            request.stop.max_tokens,
            model.config().context_length,
        );
        // The cache starts small and grows as the sequence does (fallibly).
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

    /// This checkpoint's claim on the next step; `current` says whether
    /// the weight table holds its weights now.
    pub(super) fn claim(&self, max_step_tokens: usize, current: bool) -> Claim {
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
            current,
        }
    }

    /// The chunks `spans` (from [`Group::plan`]) asks for, in sequence
    /// order: this checkpoint's share of the step that runs now.
    pub(super) fn chunks(&mut self, spans: &[Option<Range<usize>>]) -> Vec<SequenceChunk<'_, B>> {
        self.last_run = Instant::now();
        let mut chunks = Vec::with_capacity(self.active.len());
        for (sequence, span) in self.active.iter_mut().zip(spans) {
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
        chunks
    }

    /// Rows and sequences that `spans` runs.
    pub(super) fn size(spans: &[Option<Range<usize>>]) -> (usize, usize) {
        let rows = spans.iter().flatten().map(|s| s.len()).sum();
        let sequences = spans.iter().flatten().count();
        (rows, sequences)
    }

    /// Ends every sequence with `message` (the step's forward failed; which
    /// sequence caused it is unknown, so the whole batch fails rather than
    /// loop on the same error).
    pub(super) fn fail_all(&mut self, message: &str) {
        for sequence in &mut self.active {
            sequence.fail(message.to_string());
            self.checkpoint.finished();
        }
        self.active.clear();
    }

    /// Takes the step's results: each sequence whose span reached its last
    /// token samples from the next row of `logits` (`vocab` floats each).
    pub(super) fn finish<'l>(
        &mut self,
        spans: Vec<Option<Range<usize>>>,
        logits: &mut impl Iterator<Item = &'l [f32]>,
    ) {
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
            let goes_on = match logits.next() {
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
    }

    /// The tokens each sequence runs next step: one for each decoding
    /// sequence, then prompt chunks in arrival order within the step budget.
    pub(super) fn plan(&self, max_step_tokens: usize) -> Vec<Option<Range<usize>>> {
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
