//! The executor thread: admission, one batched forward per step, sampling.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use switchyard_kernels::Backend;

use super::queue::{SequenceRequest, SubmitError};
use super::sequence::Sequence;
use crate::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};

/// The executor's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Sequences in the batch at once (each holds a KV cache).
    pub max_active: usize,
    /// Requests waiting for a batch slot; beyond that, [`SubmitError::Overloaded`].
    pub max_queued: usize,
    /// Tokens one forward step runs at most (decode rows first, then prompt
    /// chunks), bounding step latency and activation memory.
    pub max_step_tokens: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            max_active: 64,
            max_queued: 256,
            max_step_tokens: 256,
        }
    }
}

/// Called with the number of waiting requests whenever it changes.
pub type QueueObserver = Arc<dyn Fn(usize) + Send + Sync>;

/// A handle to the executor thread. Dropping it lets the thread finish the
/// sequences it holds and exit.
pub struct Executor {
    requests: mpsc::Sender<SequenceRequest>,
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    max_queued: usize,
    context_length: usize,
    observer: QueueObserver,
    thread: Option<JoinHandle<()>>,
}

impl Executor {
    /// Starts the executor thread for `model` on `backend`.
    ///
    /// `observer` hears the queue depth (for a metrics gauge).
    pub fn spawn<B: Backend>(
        backend: Arc<B>,
        model: Arc<LlamaModel<B>>,
        config: ExecutorConfig,
        observer: QueueObserver,
    ) -> std::io::Result<Executor> {
        let (sender, receiver) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let context_length = model.config().context_length;
        let max_queued = config.max_queued;
        let scratch = model.new_scratch(&backend);
        let state = Scheduler {
            backend,
            model,
            scratch,
            config,
            requests: receiver,
            waiting: VecDeque::new(),
            active: Vec::new(),
            queued: queued.clone(),
            active_count: active.clone(),
            observer: observer.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("switchyard-executor".into())
            .spawn(move || state.run())?;
        Ok(Executor {
            requests: sender,
            queued,
            active,
            max_queued,
            context_length,
            observer,
            thread: Some(thread),
        })
    }

    /// Queues `request`; its events go to its sink.
    pub fn submit(&self, request: SequenceRequest) -> Result<(), SubmitError> {
        let prompt_tokens = request.prompt.len();
        if prompt_tokens == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if prompt_tokens >= self.context_length {
            return Err(SubmitError::PromptTooLong {
                prompt_tokens,
                context: self.context_length,
            });
        }
        // Reserve a queue slot first, so that concurrent submits cannot overshoot.
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < self.max_queued).then_some(queued + 1)
            });
        let depth = match reserved {
            Ok(before) => before + 1,
            Err(queued) => return Err(SubmitError::Overloaded { queued }),
        };
        if self.requests.send(request).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Stopped);
        }
        (self.observer)(depth);
        Ok(())
    }

    /// Whether the executor thread is alive (it exits only when it panics
    /// or after [`Executor::shutdown`]).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Requests waiting for a batch slot.
    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Sequences in the batch (holding a KV cache) after the last step.
    pub fn active_sequences(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// The model's context window in tokens.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// Stops taking requests, lets the thread finish what it holds, and waits for it.
    pub fn shutdown(mut self) {
        let thread = self.thread.take();
        drop(self);
        if let Some(thread) = thread {
            // A panic on the executor thread was already reported by the panic hook.
            let _ = thread.join();
        }
    }
}

/// The state the executor thread owns.
struct Scheduler<B: Backend> {
    backend: Arc<B>,
    model: Arc<LlamaModel<B>>,
    scratch: Scratch<B>,
    config: ExecutorConfig,
    requests: mpsc::Receiver<SequenceRequest>,
    waiting: VecDeque<SequenceRequest>,
    active: Vec<Sequence<B>>,
    queued: Arc<AtomicUsize>,
    /// Mirrors `active.len()` for [`Executor::active_sequences`].
    active_count: Arc<AtomicUsize>,
    observer: QueueObserver,
}

impl<B: Backend> Scheduler<B> {
    fn run(mut self) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                // Idle: sleep until a request comes or every handle is gone.
                match self.requests.recv() {
                    Ok(request) => self.waiting.push_back(request),
                    Err(mpsc::RecvError) => return,
                }
            }
            while let Ok(request) = self.requests.try_recv() {
                self.waiting.push_back(request);
            }
            // Cancelled sequences leave before the step, freeing their caches.
            self.active.retain(|sequence| !sequence.is_cancelled());
            self.admit();
            if !self.active.is_empty() {
                self.step();
            }
            self.active_count
                .store(self.active.len(), Ordering::Release);
        }
    }

    /// Moves waiting requests into the batch while there is room.
    fn admit(&mut self) {
        let mut taken = 0;
        while self.active.len() < self.config.max_active.max(1) {
            let Some(request) = self.waiting.pop_front() else {
                break;
            };
            taken += 1;
            if request.sink.is_closed() {
                continue;
            }
            let context = self.model.config().context_length;
            let wanted = request.stop.max_tokens.unwrap_or(context);
            let capacity = request.prompt.len().saturating_add(wanted).min(context);
            match self.model.new_cache(&self.backend, capacity) {
                Ok(cache) => self.active.push(Sequence::new(request, cache, capacity)),
                Err(e) => {
                    let mut request = request;
                    request.sink.send(super::SequenceEvent::Error(format!(
                        "cannot allocate a KV cache of {capacity} tokens: {e}"
                    )));
                }
            }
        }
        if taken > 0 {
            let before = self.queued.fetch_sub(taken, Ordering::AcqRel);
            (self.observer)(before.saturating_sub(taken));
        }
    }

    /// One forward pass over every active sequence, then sampling.
    fn step(&mut self) {
        let spans = self.plan();
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
        let started = std::time::Instant::now();
        let rows: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let result = self
            .model
            .forward(&self.backend, &mut chunks, &mut self.scratch);
        drop(chunks);
        tracing::debug!(
            sequences = self.active.len(),
            rows,
            forward_ms = started.elapsed().as_secs_f64() * 1e3,
            "step"
        );
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // Which sequence caused it is unknown; fail the whole batch
                // rather than loop on the same error.
                for sequence in &mut self.active {
                    sequence.fail(format!("the forward pass failed: {e}"));
                }
                self.active.clear();
                return;
            }
        };

        let vocab = self.model.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
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
            let goes_on = match rows.next() {
                Some(row) => sequence.accept_logits(row),
                None => {
                    sequence.fail("the forward pass returned fewer logits rows than asked".into());
                    false
                }
            };
            keep.push(goes_on);
        }
        let mut keep = keep.into_iter();
        self.active.retain(|_| keep.next().unwrap_or(false));
    }

    /// The tokens each active sequence runs this step: one for each decoding
    /// sequence, then prompt chunks in arrival order within the step budget.
    fn plan(&self) -> Vec<Option<std::ops::Range<usize>>> {
        let decoding = self.active.iter().filter(|s| s.is_decoding()).count();
        let mut budget = self.config.max_step_tokens.max(1).saturating_sub(decoding);
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
