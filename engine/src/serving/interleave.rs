//! A newcomer's prompt between two layers of the step in flight (issue 37).
//!
//! A forward step cannot be cut short, and a request that came while one ran
//! waited for it to end: beside another tenant's 48 decoding streams that
//! wait cost about as much as the newcomer's own prompt step, and its time
//! to first token was 2.7x its time alone. So on a backend that launches
//! each call as it comes (the CPU's), a step runs a layer at a time
//! (`model::LayeredStep`), and between two layers the executor takes the
//! requests that came meanwhile. A request of a tenant with nothing running
//! or waiting is below its share whatever the weights: fair admission would
//! give it the next slot and the next step to itself (`fair.rs`). It is
//! admitted at once instead and its prompt runs now, in a step of its own
//! with activations of its own; its first token goes out before the step in
//! flight ends, which then resumes. Every other request waits its turn in
//! the queue as before.
//!
//! Nothing is computed twice: the paused step resumes where it stopped, and
//! what a row computes does not depend on what ran between its layers, so
//! outputs are the same. The tenants running lose only the newcomer's prompt
//! time, which they lost before in the step after. A deployment without
//! tenants never interleaves: a newcomer's tenant (the one anonymous tenant)
//! always has a sequence running while a step is in flight.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use switchyard_kernels::Backend;

use super::cache_use::CacheUse;
use super::checkpoint::CheckpointHandle;
use super::group::{cache_for, share_prompt, Made};
use super::queue::{SequenceTask, Submission};
use super::sequence::Sequence;
use super::tenant_cap::TenantKv;
use super::ExecutorObserver;
use crate::kv::prefix_cache::PrefixCache;
use crate::kv::{admission as kv_admission, KvBlocks, SharedBlock};
use crate::model::{forward_step, LayeredStep, ModelError, ModelPart, Scratch, StepOutput};
use crate::speculate::Speculation;

/// What the executor lends a step that lets newcomers run between its layers.
pub(super) struct Newcomers<'a, B: Backend> {
    pub(super) backend: &'a B,
    pub(super) blocks: &'a Arc<KvBlocks<B>>,
    pub(super) requests: &'a mpsc::Receiver<Submission<B>>,
    pub(super) prefix: Option<&'a mut PrefixCache<SharedBlock<B>>>,
    /// The newcomers' activations (the step in flight keeps its own).
    pub(super) scratch: &'a mut Option<Scratch<B>>,
    pub(super) observer: &'a dyn ExecutorObserver,
    pub(super) cache_use: &'a CacheUse,
    /// Requests submitted and not admitted, over every checkpoint.
    pub(super) queued: &'a AtomicUsize,
    pub(super) speculation: Speculation,
    pub(super) max_step_tokens: usize,
    /// The checkpoints of the step in flight: a newcomer runs only on one of
    /// them (the weights the step reads).
    pub(super) checkpoints: &'a [CheckpointHandle<B>],
    /// Tenants with a sequence running or a request waiting, and those of
    /// the requests that came during the step.
    pub(super) busy: HashSet<Option<Arc<str>>>,
    /// Batch slots free (none while an older request waits for KV room).
    pub(super) slots: usize,
    /// Requests that came during the step and wait their turn, in order.
    pub(super) later: Vec<Submission<B>>,
    /// Newcomers admitted during the step: they join their checkpoint's
    /// batch after it.
    pub(super) joined: Vec<(CheckpointHandle<B>, Sequence<B>)>,
    /// Steps the newcomers ran, and the time they took.
    pub(super) steps: u64,
    pub(super) paused: Duration,
}

impl<B: Backend> Newcomers<'_, B> {
    /// One forward step over `parts`, a layer at a time, taking newcomers
    /// after each layer; returns what `forward_step` returns.
    pub(super) fn forward<'s>(
        &mut self,
        parts: &mut [ModelPart<'_, '_, B>],
        scratch: &'s mut Scratch<B>,
    ) -> Result<StepOutput<'s>, ModelError> {
        let mut step = LayeredStep::begin(self.backend, parts, scratch)?;
        while step.has_layer() {
            let mut store = self.blocks.lock();
            step.layer(self.backend, &mut store, parts, scratch)?;
            // Newcomers lock the store themselves (allocation, the prompt cache).
            drop(store);
            self.take_arrivals();
        }
        step.finish(self.backend, parts, scratch)
    }

    /// Takes every request that came since the last look: a newcomer runs
    /// its prompt now, the others wait their turn.
    fn take_arrivals(&mut self) {
        while let Ok(submission) = self.requests.try_recv() {
            if let Some(waits) = self.take(submission) {
                self.later.push(waits);
            }
        }
    }

    /// Runs `submission`'s prompt now if it is a newcomer that can run;
    /// else hands it back to wait its turn.
    fn take(&mut self, submission: Submission<B>) -> Option<Submission<B>> {
        let request = &submission.request;
        let checkpoint = &submission.checkpoint;
        let newcomer = self.slots > 0
            && !self.busy.contains(&request.share.tenant)
            && request.task == SequenceTask::Generate
            && !request.sink.is_closed()
            && self.checkpoints.iter().any(|c| Arc::ptr_eq(c, checkpoint));
        // Either way its tenant now has a request in: a later one of the
        // same tenant waits behind it.
        self.busy.insert(request.share.tenant.clone());
        if !newcomer {
            return Some(submission);
        }
        let kv_bytes =
            kv_admission::cache_bytes(self.blocks.pool(), &checkpoint.model, request.kv_wanted())
                .unwrap_or(0);
        // Nothing of its tenant runs: its whole part of the budget is free.
        if !TenantKv::new(self.blocks.pool().budget_bytes()).fits(&request.share, kv_bytes) {
            return Some(submission);
        }
        let Made {
            cache,
            shared_blocks,
            cached,
        } = cache_for(
            self.backend,
            self.blocks,
            checkpoint,
            request,
            self.prefix.as_deref_mut(),
        );
        // No room now: the queue's admission decides when (or fails it).
        let Ok(cache) = cache else {
            return Some(submission);
        };
        let Submission {
            checkpoint,
            request,
            ..
        } = submission;
        self.admitted(&checkpoint, &request, cached);
        let capacity = kv_admission::positions(&checkpoint.model, request.kv_wanted());
        let sequence = Sequence::new(
            request,
            cache,
            capacity,
            shared_blocks,
            cached,
            self.speculation.control(),
        );
        self.run(checkpoint, sequence);
        None
    }

    /// Counts a request taken out of the queue with `cached` prompt tokens
    /// from the prompt cache, as the queue's admission does.
    fn admitted(
        &mut self,
        checkpoint: &CheckpointHandle<B>,
        request: &super::queue::SequenceRequest,
        cached: usize,
    ) {
        self.slots = self.slots.saturating_sub(1);
        self.queued.fetch_sub(1, Ordering::AcqRel);
        checkpoint.admitted();
        self.observer
            .queue_depth(&checkpoint.id, checkpoint.queued());
        if self.prefix.is_some() && checkpoint.caches_prompts {
            let computed = request.prompt.len().saturating_sub(cached);
            self.observer.prompt_cache(&checkpoint.id, cached, computed);
            let scope = request.cache_scope.label();
            self.cache_use.count(&scope, cached, computed);
        }
    }

    /// Runs `sequence`'s prompt (at most a step's budget of it) in a step of
    /// its own and samples its first token when the prompt is all in.
    fn run(&mut self, checkpoint: CheckpointHandle<B>, mut sequence: Sequence<B>) {
        let span = sequence.next_span(self.max_step_tokens.max(1));
        if span.is_empty() {
            self.joined.push((checkpoint, sequence));
            return;
        }
        let started = Instant::now();
        let backend = self.backend;
        let scratch = self
            .scratch
            .get_or_insert_with(|| checkpoint.model.new_scratch(backend));
        let result = match sequence.chunk(backend, span.clone()) {
            Ok(chunk) => {
                let mut chunks = [chunk];
                let mut parts = [ModelPart {
                    model: &checkpoint.model,
                    chunks: &mut chunks,
                    adapter: checkpoint.adapter.as_ref(),
                }];
                let mut store = self.blocks.lock();
                forward_step(backend, &mut store, &mut parts, scratch)
                    .map_err(|e| format!("the forward pass failed: {e}"))
            }
            Err(e) => Err(format!("the KV blocks of the step could not be had: {e}")),
        };
        let elapsed = started.elapsed();
        self.steps += 1;
        self.paused += elapsed;
        self.observer.step(&checkpoint.id, span.len(), 1, elapsed);
        let out = match result {
            Ok(out) => out,
            Err(message) => {
                sequence.fail(message);
                checkpoint.finished();
                return;
            }
        };
        sequence.processed = span.end;
        if span.end < sequence.tokens.len() {
            // A long prompt: the rest runs in the batch's steps.
            self.joined.push((checkpoint, sequence));
            return;
        }
        let vocab = checkpoint.model.config().vocab_size;
        let goes_on = match out.logits.get(..vocab) {
            Some(row) => sequence.accept_logits(row),
            None => {
                sequence.fail("the forward pass returned no logits row".into());
                false
            }
        };
        // After the first token went out, as in the batch's steps.
        if let Some(cache) = self.prefix.as_deref_mut() {
            if checkpoint.caches_prompts {
                share_prompt(backend, checkpoint.cache_key(), &mut sequence, cache);
            }
        }
        if goes_on {
            self.joined.push((checkpoint, sequence));
        } else {
            checkpoint.finished();
        }
    }
}
