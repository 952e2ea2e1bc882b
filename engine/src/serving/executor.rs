//! The executor: one thread, many checkpoints, one batch per step.
//!
//! Each checkpoint has its own queue and batch ([`Group`]). Every step the
//! thread picks one checkpoint ([`super::choice`]), adds the runnable
//! checkpoints that share most of its tensors (a base and checkpoints
//! derived from it: their shared matrices then multiply every row at once),
//! points the weight table at them (an `ArcSwap` store: a pointer swap, not
//! a copy), and runs one forward over their batches. Sequences of other
//! checkpoints keep their KV caches and resume where they were. Admission
//! is global and in arrival order, bounded by one pool of sequence slots
//! (each slot holds a KV cache) shared by all checkpoints.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use arc_swap::ArcSwapOption;
use switchyard_kernels::Backend;

use super::cache_use::{CacheUse, ScopeCacheUse};
use super::checkpoint::{CheckpointHandle, CheckpointId};
use super::group::{Admission, Group};
use super::interleave::Newcomers;
use super::queue::{SequenceRequest, Submission, SubmitError, Waiting};
use super::step_profile::{Stage, StepProfile};
use super::table::WeightTable;
use super::tenant_cap::{TenantKv, TenantQueue};
use super::{choice, prefetch, step_family, ExecutorObserver};
use crate::kv::prefix_cache::PrefixCache;
use crate::kv::{admission as kv_admission, KvBlocks, KvConfig, KvPool, SharedBlock};
use crate::model::{forward_step, ModelPart};
use crate::speculate::{self, Speculation};

/// The executor's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Sequences running at once over all checkpoints (each holds a KV cache).
    pub max_active: usize,
    /// Requests waiting for a batch slot; beyond that, [`SubmitError::Overloaded`].
    pub max_queued: usize,
    /// Tokens one forward step runs at most (decode rows first, then prompt
    /// chunks), bounding step latency and activation memory; while many
    /// sequences run, a step runs fewer (`step_room.rs`).
    pub max_step_tokens: usize,
    /// Keep full prompt blocks after their sequence ends and reuse them
    /// for later prompts that start the same (`prefix_cache`).
    pub prompt_cache: bool,
    /// The KV element type, block size and budget every sequence's cache
    /// and the prompt cache's blocks share.
    pub kv: KvConfig,
    /// Whether decoding sequences draft tokens to verify (`speculate`).
    pub speculation: Speculation,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            max_active: 64,
            max_queued: 256,
            max_step_tokens: 256,
            prompt_cache: true,
            kv: KvConfig::default(),
            speculation: Speculation::default(),
        }
    }
}

/// Counters the handle reads while the thread runs.
#[derive(Default)]
struct Shared {
    queued: AtomicUsize,
    active: AtomicUsize,
    /// Token positions written in the running sequences' KV caches.
    kv_tokens: AtomicUsize,
    /// KV bytes in use: what the budget has reserved, less cached prompt
    /// blocks no sequence reads (admission evicts those for room).
    kv_bytes: AtomicUsize,
    swaps: AtomicU64,
    steps: AtomicU64,
    /// Moving average of a forward step's duration, in microseconds.
    step_micros: AtomicU64,
    /// Set when the executor thread ends, by return or by panic.
    stopped: AtomicBool,
    /// Each cache scope's use of the prompt cache, for the admin API.
    cache_use: CacheUse,
}

impl Shared {
    fn step_time(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.step_micros.load(Ordering::Acquire))
    }
}

/// Marks the executor stopped when the thread ends, unwinding included.
struct MarkStopped(Arc<Shared>);

impl Drop for MarkStopped {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
    }
}

/// A cheap read-only view of the executor's health and pace, to keep where
/// the [`Executor`] handle cannot go (routing probes).
#[derive(Clone)]
pub struct ExecutorPulse {
    shared: Arc<Shared>,
}

impl ExecutorPulse {
    /// Whether the executor thread is alive.
    pub fn is_running(&self) -> bool {
        !self.shared.stopped.load(Ordering::Acquire)
    }

    /// As [`Executor::step_time`].
    pub fn step_time(&self) -> std::time::Duration {
        self.shared.step_time()
    }
}

/// A handle to the executor thread. Dropping it lets the thread finish the
/// sequences it holds and exit.
pub struct Executor<B: Backend> {
    requests: mpsc::Sender<Submission<B>>,
    /// To ask at submit whether a request's KV cache can ever fit.
    kv: Arc<KvPool>,
    shared: Arc<Shared>,
    table: Arc<ArcSwapOption<WeightTable<B>>>,
    max_queued: usize,
    /// Each capped tenant's requests waiting (`tenant_cap.rs`).
    tenant_queue: Arc<TenantQueue>,
    /// Sequence slots, each holding one KV cache: the KV capacity.
    kv_slots: usize,
    thread: Option<JoinHandle<()>>,
}

impl<B: Backend> Executor<B> {
    /// Starts the executor thread on `backend`. `observer` hears queue
    /// depths, swaps and steps (for metrics and benchmarks).
    pub fn spawn(
        backend: Arc<B>,
        config: ExecutorConfig,
        observer: Arc<dyn ExecutorObserver>,
    ) -> std::io::Result<Executor<B>> {
        let (sender, receiver) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let table = Arc::new(ArcSwapOption::empty());
        let max_queued = config.max_queued;
        let kv_slots = config.max_active.max(1);
        let kv = KvPool::new(config.kv);
        let blocks = KvBlocks::new(&*backend, &kv).map_err(std::io::Error::other)?;
        let prefix = config
            .prompt_cache
            .then(|| PrefixCache::new(kv.block_positions(), switchyard_kernels::kv::KV_UNIT));
        let state = Scheduler {
            prefix,
            blocks,
            cached_blocks: 0,
            blocked_head: None,
            profile: StepProfile::from_env(),
            scratch: None,
            newcomer_scratch: None,
            backend,
            config,
            requests: receiver,
            groups: Vec::new(),
            table: table.clone(),
            shared: shared.clone(),
            observer,
        };
        let thread = std::thread::Builder::new()
            .name("switchyard-executor".into())
            .spawn(move || {
                let _mark = MarkStopped(Arc::clone(&state.shared));
                state.run()
            })?;
        Ok(Executor {
            requests: sender,
            kv,
            shared,
            table,
            max_queued,
            tenant_queue: Arc::default(),
            kv_slots,
            thread: Some(thread),
        })
    }

    /// Queues `request` to run on `checkpoint`; its events go to its sink.
    /// The request stays on this checkpoint (this version) to its end.
    pub fn submit(
        &self,
        checkpoint: &CheckpointHandle<B>,
        request: SequenceRequest,
    ) -> Result<(), SubmitError> {
        // The context window was checked once, where the request became a sequence
        // (`engine::prepare`); a sequence that runs past it anyway (a direct caller's)
        // ends with the model's error, not a wrong answer.
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if let Some(refusal) =
            kv_admission::never_fits(&self.kv, &checkpoint.model, request.kv_wanted())
        {
            return Err(SubmitError::KvBudget {
                positions: refusal.positions,
                needed_bytes: refusal.needed_bytes,
                budget_bytes: refusal.budget_bytes,
                advice: refusal.advice,
                prompt_too_long: refusal.prompt_too_long,
            });
        }
        // Reserve the tenant's place and a queue slot first, so that
        // concurrent submits cannot overshoot.
        let ticket = self
            .tenant_queue
            .enter(&request.share, self.max_queued)
            .map_err(|full| SubmitError::TenantQueueFull {
                waiting: full.waiting,
            })?;
        let reserved =
            self.shared
                .queued
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                    (queued < self.max_queued).then_some(queued + 1)
                });
        if let Err(queued) = reserved {
            return Err(SubmitError::Overloaded { queued });
        }
        checkpoint.enqueued();
        let submission = Submission {
            checkpoint: checkpoint.clone(),
            request,
            arrived: Instant::now(),
            ticket,
        };
        if self.requests.send(submission).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            checkpoint.admitted();
            checkpoint.finished();
            return Err(SubmitError::Stopped);
        }
        Ok(())
    }

    /// Refuses a request of `fanout` generations like `request` whose KV
    /// caches together would exceed the share of the budget one request may
    /// hold (see [`kv_admission::REQUEST_SHARE`]) or its tenant's part of it
    /// (`tenant_cap.rs`).
    pub fn check_share(
        &self,
        checkpoint: &CheckpointHandle<B>,
        request: &SequenceRequest,
        fanout: usize,
    ) -> Result<(), SubmitError> {
        let wanted = request.kv_wanted();
        if let Some(over) = kv_admission::over_share(&self.kv, &checkpoint.model, wanted, fanout) {
            return Err(SubmitError::KvShare {
                fanout,
                needed_bytes: over.needed_bytes,
                share_bytes: over.share_bytes,
                share: kv_admission::REQUEST_SHARE,
            });
        }
        let share = &request.share;
        let share_bytes = share.part_of(self.kv.budget_bytes());
        let needed_bytes = kv_admission::cache_bytes(&self.kv, &checkpoint.model, wanted)
            .unwrap_or(0)
            .saturating_mul(fanout.max(1));
        if needed_bytes > share_bytes {
            return Err(SubmitError::TenantKvShare {
                fanout: fanout.max(1),
                needed_bytes,
                share_bytes,
                permille: share.kv_permille,
            });
        }
        Ok(())
    }

    /// Whether the executor thread is alive (it exits only when it panics
    /// or after [`Executor::shutdown`]).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// A view of [`Executor::is_running`] and [`Executor::step_time`] that
    /// does not hold the executor up.
    pub fn pulse(&self) -> ExecutorPulse {
        ExecutorPulse {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Requests waiting for a batch slot, over all checkpoints.
    pub fn queue_depth(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Sequences holding a KV cache after the last step, over all checkpoints.
    pub fn active_sequences(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Sequence slots over all checkpoints, each holding one KV cache
    /// (`--max-batch`): at most this many sequences run at once.
    pub fn kv_slots(&self) -> usize {
        self.kv_slots
    }

    /// Token positions written in the running sequences' KV caches after
    /// the last step (what their caches hold in RAM, rounded to pages).
    pub fn kv_tokens(&self) -> usize {
        self.shared.kv_tokens.load(Ordering::Acquire)
    }

    /// KV bytes in use after the last step: the bytes the KV budget
    /// (`kv_pool().budget_bytes()`) has reserved, which admission reserves a
    /// newcomer's cache against, less the cached prompt blocks no sequence
    /// reads, which admission evicts to make room. A newcomer whose cache
    /// needs more than the budget less this waits.
    pub fn kv_bytes(&self) -> usize {
        self.shared.kv_bytes.load(Ordering::Acquire)
    }

    /// Each cache scope owner's blocks and bytes in the prompt cache and the
    /// prompt tokens its lookups found and missed, since the server started.
    pub fn cache_use(&self) -> Vec<ScopeCacheUse> {
        self.shared.cache_use.snapshot()
    }

    /// The KV budget its sequences and the prompt cache reserve from.
    pub fn kv_pool(&self) -> &Arc<KvPool> {
        &self.kv
    }

    /// Weight-table swaps so far.
    pub fn swaps(&self) -> u64 {
        self.shared.swaps.load(Ordering::Acquire)
    }

    /// Forward steps so far.
    pub fn steps(&self) -> u64 {
        self.shared.steps.load(Ordering::Acquire)
    }

    /// Recent average duration of one forward step (one token for each
    /// decoding sequence of the batch).
    pub fn step_time(&self) -> std::time::Duration {
        self.shared.step_time()
    }

    /// The checkpoint whose weights the table points at now.
    pub fn current(&self) -> Option<CheckpointId> {
        self.table.load().as_ref().and_then(|t| t.lead_id())
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
    /// The device's KV blocks, and the budget they reserve from.
    blocks: Arc<KvBlocks<B>>,
    /// Activation buffers, reused by every checkpoint (resized per step).
    scratch: Option<crate::model::Scratch<B>>,
    /// A newcomer's, while the step in flight pauses (`interleave.rs`).
    newcomer_scratch: Option<crate::model::Scratch<B>>,
    config: ExecutorConfig,
    requests: mpsc::Receiver<Submission<B>>,
    /// Checkpoints with work, in the order their first request came.
    groups: Vec<Group<B>>,
    /// The weight table the forward reads: swapped between steps.
    table: Arc<ArcSwapOption<WeightTable<B>>>,
    shared: Arc<Shared>,
    observer: Arc<dyn ExecutorObserver>,
    /// The prompt cache, unless turned off.
    prefix: Option<PrefixCache<SharedBlock<B>>>,
    /// Blocks it held when last reported.
    cached_blocks: usize,
    /// The oldest request while the KV budget has no room for it, and how
    /// many younger ones were admitted past it since (see `admit`).
    blocked_head: Option<(Instant, usize)>,
    /// Stage times of decode steps, when asked for (`step_profile.rs`).
    profile: StepProfile,
}

/// Younger requests that may be admitted past an oldest one the KV budget
/// has no room for yet; then the line waits for it. Bounded, so that a
/// stream of small requests cannot starve a large one.
const MAX_BYPASS: usize = 32;
/// Waiting requests of each checkpoint considered for admission past a
/// blocked oldest one (the queue is in arrival order).
const BYPASS_LOOKAHEAD: usize = 16;

/// How long the executor waits when every checkpoint with work is still
/// copying up to the device.
const COPY_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// How often an idle executor looks for unloaded versions whose cached
/// prompt blocks it can drop.
const IDLE_PURGE: std::time::Duration = std::time::Duration::from_millis(200);

impl<B: Backend> Scheduler<B> {
    fn run(mut self) {
        loop {
            if self.groups.is_empty() {
                // Idle: sleep until a request comes or every handle is
                // gone; with cached prompt blocks, wake now and then to
                // drop those of versions unloaded meanwhile.
                let holding = self.prefix.as_ref().is_some_and(|p| p.len() > 0);
                if holding {
                    match self.requests.recv_timeout(IDLE_PURGE) {
                        Ok(submission) => self.accept(submission),
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            self.purge_unloaded();
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match self.requests.recv() {
                        Ok(submission) => self.accept(submission),
                        Err(mpsc::RecvError) => return,
                    }
                }
                self.profile.resume();
            }
            while let Ok(submission) = self.requests.try_recv() {
                self.accept(submission);
            }
            for group in &mut self.groups {
                group.drop_cancelled();
            }
            // Before any lookup: a dropped version's weight identity may
            // be reused by the next load (see `prefix_cache`).
            self.purge_unloaded();
            self.admit();
            self.step_one();
            self.report_prompt_cache();
            self.groups.retain(|g| !g.is_idle());
            if self.groups.is_empty() {
                // Idle: let go of the last weights so that an unloaded or
                // evicted version's memory is freed now, not at the next swap.
                self.table.store(None);
                self.profile.report();
            }
            let active = self.groups.iter().map(Group::active_len).sum();
            self.shared.active.store(active, Ordering::Release);
            let kv_tokens = self.groups.iter().map(Group::kv_tokens).sum();
            self.shared.kv_tokens.store(kv_tokens, Ordering::Release);
            self.shared
                .kv_bytes
                .store(self.kv_bytes(), Ordering::Release);
        }
    }

    /// KV bytes in use (see [`Executor::kv_bytes`]): the pool's reserved
    /// figure, which admission reserves against, less what eviction frees.
    fn kv_bytes(&self) -> usize {
        let unread = self.prefix.as_ref().map_or(0, PrefixCache::unread_bytes);
        self.blocks.pool().reserved_bytes().saturating_sub(unread)
    }

    /// Drops the cached prompt blocks of versions no longer loaded.
    fn purge_unloaded(&mut self) {
        if let Some(prefix) = self.prefix.as_mut() {
            if prefix.purge_unloaded() > 0 {
                self.report_prompt_cache();
            }
        }
    }

    /// Tells the observer of evictions and of the prompt cache's size.
    fn report_prompt_cache(&mut self) {
        let Some(prefix) = self.prefix.as_mut() else {
            return;
        };
        let evicted = prefix.take_evicted();
        if evicted > 0 {
            self.observer.prompt_cache_evicted(evicted);
        }
        if prefix.len() != self.cached_blocks || evicted > 0 {
            self.cached_blocks = prefix.len();
            self.observer
                .prompt_cache_size(prefix.len(), prefix.bytes());
            let usage = prefix.usage_by_scope();
            self.observer.prompt_cache_scopes(&usage);
            self.shared.cache_use.set_held(&usage);
        }
    }

    fn accept(&mut self, submission: Submission<B>) {
        if let Some(prefix) = self.prefix.as_mut() {
            let owner: std::sync::Weak<dyn std::any::Any + Send + Sync> =
                Arc::downgrade(&submission.checkpoint) as _;
            prefix.register(submission.checkpoint.weight_identity, owner);
        }
        let kv_bytes = kv_admission::cache_bytes(
            self.blocks.pool(),
            &submission.checkpoint.model,
            submission.request.kv_wanted(),
        )
        .unwrap_or(0);
        let waiting = Waiting {
            request: submission.request,
            arrived: submission.arrived,
            kv_bytes,
            _ticket: submission.ticket,
        };
        let checkpoint = submission.checkpoint;
        match self
            .groups
            .iter_mut()
            .find(|g| Arc::ptr_eq(&g.checkpoint, &checkpoint))
        {
            Some(group) => group.waiting.push_back(waiting),
            None => {
                let mut group = Group::new(checkpoint, waiting.arrived, self.config.speculation);
                group.waiting.push_back(waiting);
                self.groups.push(group);
            }
        }
    }

    /// Moves waiting requests into batches, oldest first over every
    /// checkpoint, while the shared pool has slots and the KV budget room.
    /// When the oldest has no room yet, younger ones that fit may pass it,
    /// at most [`MAX_BYPASS`] of them: one large request held everyone
    /// behind it before, and with no bound small ones could starve it. A
    /// request whose tenant holds its part of the budget (`tenant_cap.rs`)
    /// is passed without bound: only its own tenant's sequences make room
    /// for it.
    fn admit(&mut self) {
        let mut active: usize = self.groups.iter().map(Group::active_len).sum();
        let mut taken = 0;
        'slots: while active < self.config.max_active.max(1) {
            let mut tenants = TenantKv::new(self.blocks.pool().budget_bytes());
            for group in &self.groups {
                group.hold(&mut tenants);
            }
            // Whether an older request waits for room in the budget.
            let mut passes = false;
            for (index, at, arrived) in self.waiting_in_order() {
                let passed = self.blocked_head.map_or(0, |(_, passed)| passed);
                if passes && passed >= MAX_BYPASS {
                    break 'slots;
                }
                let Some(group) = self.groups.get_mut(index) else {
                    break 'slots;
                };
                match group.admit_at(
                    at,
                    &self.backend,
                    &self.blocks,
                    active > 0,
                    self.prefix.as_mut(),
                    &tenants,
                ) {
                    Admission::Admitted {
                        cached,
                        prompt,
                        scope,
                    } => {
                        taken += 1;
                        active += 1;
                        if self.prefix.is_some() && group.checkpoint.caches_prompts {
                            let computed = prompt.saturating_sub(cached);
                            self.observer
                                .prompt_cache(&group.checkpoint.id, cached, computed);
                            self.shared.cache_use.count(&scope, cached, computed);
                        }
                        self.blocked_head = match self.blocked_head {
                            Some((head, passed)) if passes => Some((head, passed + 1)),
                            _ => None,
                        };
                        continue 'slots;
                    }
                    Admission::Dropped => {
                        taken += 1;
                        if !passes {
                            self.blocked_head = None;
                        }
                        continue 'slots;
                    }
                    Admission::Wait if !passes => {
                        passes = true;
                        if self.blocked_head.is_none_or(|(head, _)| head != arrived) {
                            self.blocked_head = Some((arrived, 0));
                        }
                    }
                    Admission::Wait | Admission::TenantFull | Admission::Empty => {}
                }
            }
            break;
        }
        if taken > 0 {
            self.shared.queued.fetch_sub(taken, Ordering::AcqRel);
            for group in &self.groups {
                self.observer
                    .queue_depth(&group.checkpoint.id, group.checkpoint.queued());
            }
        }
    }

    /// Waiting requests as (group, position in its queue, arrival), oldest
    /// first: the first [`BYPASS_LOOKAHEAD`] of each checkpoint.
    fn waiting_in_order(&self) -> Vec<(usize, usize, Instant)> {
        let mut order: Vec<(usize, usize, Instant)> = self
            .groups
            .iter()
            .enumerate()
            .flat_map(|(index, group)| {
                group
                    .waiting
                    .iter()
                    .take(BYPASS_LOOKAHEAD)
                    .enumerate()
                    .map(move |(at, waiting)| (index, at, waiting.arrived))
            })
            .collect();
        order.sort_by_key(|&(_, _, arrived)| arrived);
        order
    }

    /// Picks a checkpoint and the checkpoints that can share its step,
    /// points the weight table at them if it is not already, runs the step.
    fn step_one(&mut self) {
        self.profile.start_step();
        let budget = self.config.max_step_tokens;
        self.draft(budget);
        self.profile.mark(Stage::Draft);
        let now = Instant::now();
        let current = self.table.load_full();
        let claims: Vec<choice::Claim> = self
            .groups
            .iter()
            .map(|g| {
                let held = current.as_ref().is_some_and(|t| t.holds(&g.checkpoint));
                g.claim(budget, held)
            })
            .collect();
        // Only checkpoints with something to run compete, and only those
        // whose weights are on the device (`prefetch.rs`).
        let resident = prefetch::resident(&*self.backend, &self.groups);
        let runnable: Vec<usize> = claims
            .iter()
            .enumerate()
            .filter(|(i, c)| c.rows > 0 && resident.get(*i).copied().unwrap_or(false))
            .map(|(i, _)| i)
            .collect();
        // The next batch's weights start copying up before this step runs.
        if let Err((index, message)) =
            prefetch::next(&*self.backend, &self.groups, &claims, &resident, now)
        {
            if let Some(group) = self.groups.get_mut(index) {
                group.fail_all(&message);
            }
        }
        let Some(chosen) = step_family::choose_lead(&self.groups, &claims, &runnable, now) else {
            if claims.iter().any(|c| c.rows > 0) {
                // Only copies in flight: wait a little for them, not a spin.
                std::thread::sleep(COPY_POLL);
            }
            return;
        };
        let plan = self.plan_step(chosen, &runnable);
        if plan.is_empty() {
            return;
        }
        // Counted only for the profile: the loop pays nothing without it.
        let decode_rows = self.profile.on().then(|| {
            plan.iter().try_fold(0, |rows, (i, spans)| {
                Some(rows + self.groups.get(*i)?.decode_rows_of(spans)?)
            })
        });
        let wanted: Vec<CheckpointHandle<B>> = plan
            .iter()
            .filter_map(|(i, _)| self.groups.get(*i))
            .map(|g| g.checkpoint.clone())
            .collect();

        let decided = Instant::now();
        let swapped_from = match &current {
            Some(table) if table.is(&wanted) => None,
            other => Some(other.as_ref().and_then(|t| t.lead_id())),
        };
        if swapped_from.is_some() {
            self.table.store(Some(Arc::new(WeightTable {
                checkpoints: wanted,
            })));
        }
        // The forward reads its weights through the table from here on.
        let Some(table) = self.table.load_full() else {
            return;
        };
        let Some(lead) = table.lead() else { return };
        if let Some(from) = swapped_from {
            let latency = decided.elapsed();
            self.shared.swaps.fetch_add(1, Ordering::AcqRel);
            self.observer.swap(from.as_ref(), &lead.id, latency);
        }
        self.profile.mark(Stage::Plan);
        let started = Instant::now();
        let emitted = self.run_step(&table, plan);
        let elapsed = started.elapsed();
        self.profile.end_step(decode_rows.flatten(), emitted);
        self.shared.steps.fetch_add(1, Ordering::AcqRel);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let average = self.shared.step_micros.load(Ordering::Acquire);
        // An exponential moving average over ~8 steps.
        let updated = if average == 0 {
            micros
        } else {
            (average * 7 + micros) / 8
        };
        self.shared.step_micros.store(updated, Ordering::Release);
    }

    /// Lets decoding sequences draft their next tokens while speculation
    /// pays (`speculate::drafts_pay`: few sequences decode, no prompt runs
    /// or waits), within the step's `budget` rows; clears drafts otherwise.
    fn draft(&mut self, budget: usize) {
        let (decoding, prefilling) = self
            .groups
            .iter()
            .map(Group::load)
            .fold((0, 0), |(d, p), (gd, gp)| (d + gd, p + gp));
        let waiting = self.shared.queued.load(Ordering::Acquire);
        let allowed = self.config.speculation != Speculation::Off
            && speculate::drafts_pay(decoding, prefilling, waiting);
        for group in &mut self.groups {
            group.draft(allowed, budget, &self.backend, &self.blocks);
        }
    }

    /// The groups that run this step, `chosen` first, with the spans each
    /// runs: `chosen` plus every runnable group whose checkpoint shares
    /// most tensors with it, while the step's token budget lasts.
    fn plan_step(&self, chosen: usize, runnable: &[usize]) -> Vec<(usize, Spans)> {
        let Some(lead) = self.groups.get(chosen) else {
            return Vec::new();
        };
        let mut budget = self.config.max_step_tokens.max(1);
        let mut plan = Vec::new();
        let companions = runnable.iter().copied().filter(|&i| {
            i != chosen
                && self
                    .groups
                    .get(i)
                    .is_some_and(|g| lead.checkpoint.model.shares_steps_with(&g.checkpoint.model))
        });
        for index in std::iter::once(chosen).chain(companions) {
            if budget == 0 {
                break;
            }
            let Some(group) = self.groups.get(index) else {
                continue;
            };
            let spans = group.plan(budget);
            let (rows, _) = Group::<B>::size(&spans);
            if rows == 0 {
                continue;
            }
            budget = budget.saturating_sub(rows);
            plan.push((index, spans));
        }
        plan
    }

    /// One forward over the planned groups' chunks with the table's
    /// weights (the table lists the groups' checkpoints in plan order),
    /// then sampling. Returns the tokens it emitted (each sequence's
    /// one and the drafts it kept; for the step profile).
    fn run_step(&mut self, table: &WeightTable<B>, plan: Vec<(usize, Spans)>) -> usize {
        // Who may come as a newcomer during the step (`interleave.rs`): a
        // tenant with nothing running or waiting, while a slot is free and
        // no older request waits for KV room.
        let busy: HashSet<Option<Arc<str>>> = (self.groups.iter())
            .flat_map(Group::tenants)
            .cloned()
            .collect();
        let active: usize = self.groups.iter().map(Group::active_len).sum();
        let slots = match self.blocked_head {
            Some(_) => 0,
            None => self.config.max_active.max(1).saturating_sub(active),
        };
        let order: Vec<usize> = plan.iter().map(|(i, _)| *i).collect();
        let mut picked: Vec<(usize, &mut Group<B>)> = self
            .groups
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| order.contains(i))
            .collect();
        picked.sort_by_key(|(i, _)| order.iter().position(|o| o == i));
        let spans: Vec<Spans> = plan.into_iter().map(|(_, s)| s).collect();
        let Some(lead) = table.lead() else { return 0 };
        let scratch = self
            .scratch
            .get_or_insert_with(|| lead.model.new_scratch(&self.backend));

        let backend = &*self.backend;
        let chunk_lists: Result<Vec<_>, _> = picked
            .iter_mut()
            .zip(&spans)
            .map(|((_, group), spans)| group.chunks(backend, spans))
            .collect();
        let mut chunk_lists = match chunk_lists {
            Ok(lists) => lists,
            Err(e) => {
                let message = format!("the KV blocks of the step could not be had: {e}");
                for (_, group) in picked.iter_mut() {
                    group.fail_all(&message);
                }
                return 0;
            }
        };
        self.profile.mark(Stage::Chunks);
        let mut parts: Vec<ModelPart<'_, '_, B>> = chunk_lists
            .iter_mut()
            .zip(&table.checkpoints)
            .map(|(chunks, checkpoint)| ModelPart {
                model: &checkpoint.model,
                chunks,
                adapter: checkpoint.adapter.as_ref(),
            })
            .collect();
        let started = Instant::now();
        // A backend that launches each call as it comes can pause the step
        // between layers for a newcomer's prompt (`interleave.rs`); a
        // device's records and replays whole steps.
        let mut newcomers = (!B::DEVICE_MEMORY).then(|| Newcomers {
            backend,
            blocks: &self.blocks,
            requests: &self.requests,
            prefix: self.prefix.as_mut(),
            scratch: &mut self.newcomer_scratch,
            observer: &*self.observer,
            cache_use: &self.shared.cache_use,
            queued: &self.shared.queued,
            speculation: self.config.speculation,
            max_step_tokens: self.config.max_step_tokens,
            checkpoints: &table.checkpoints,
            busy,
            slots,
            later: Vec::new(),
            joined: Vec::new(),
            steps: 0,
            paused: std::time::Duration::ZERO,
        });
        let result = match newcomers.as_mut() {
            Some(newcomers) => newcomers.forward(&mut parts, scratch),
            None => {
                let mut store = self.blocks.lock();
                forward_step(backend, &mut store, &mut parts, scratch)
            }
        };
        drop(parts);
        drop(chunk_lists);
        let (later, joined, paused) = match newcomers {
            Some(n) => {
                self.shared.steps.fetch_add(n.steps, Ordering::AcqRel);
                (n.later, n.joined, n.paused)
            }
            None => (Vec::new(), Vec::new(), std::time::Duration::ZERO),
        };
        let elapsed = started.elapsed().saturating_sub(paused);
        self.profile.mark(Stage::Forward);

        let mut emitted = 0;
        match result {
            Ok(out) => {
                let vocab = lead.model.config().vocab_size.max(1);
                let hidden = lead.model.config().hidden_size.max(1);
                let mut rows = out.logits.chunks_exact(vocab);
                let mut pooled = out.pooled.chunks_exact(hidden);
                for ((_, group), spans) in picked.iter_mut().zip(spans) {
                    let (count, sequences) = Group::<B>::size(&spans);
                    self.observer
                        .step(&group.checkpoint.id, count, sequences, elapsed);
                    group.finish(
                        &self.backend,
                        spans,
                        &mut rows,
                        &mut pooled,
                        self.prefix.as_mut(),
                    );
                    let (drafted, accepted) = group.take_speculation();
                    emitted += sequences + accepted;
                    if drafted > 0 {
                        self.observer
                            .speculation(&group.checkpoint.id, drafted, accepted);
                    }
                }
            }
            Err(e) => {
                let message = format!("the forward pass failed: {e}");
                for (_, group) in picked.iter_mut() {
                    group.fail_all(&message);
                }
            }
        }
        self.profile.mark(Stage::Finish);
        drop(picked);
        for submission in later {
            self.accept(submission);
        }
        for (checkpoint, sequence) in joined {
            let group = self
                .groups
                .iter_mut()
                .find(|g| Arc::ptr_eq(&g.checkpoint, &checkpoint));
            match group {
                Some(group) => group.join(sequence),
                None => {
                    let mut group = Group::new(checkpoint, Instant::now(), self.config.speculation);
                    group.join(sequence);
                    self.groups.push(group);
                }
            }
        }
        emitted
    }
}

/// Each sequence's span of tokens in a step (`None`: it sits this one out).
type Spans = Vec<Option<std::ops::Range<usize>>>;

/// Observer that ignores everything (tests, tools).
pub struct NoObserver;

impl ExecutorObserver for NoObserver {}
