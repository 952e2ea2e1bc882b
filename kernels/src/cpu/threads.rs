//! A small persistent thread pool tuned for many short kernel calls.
//!
//! A forward pass calls a few hundred kernels per token, each a few to a few
//! hundred microseconds long, so dispatch must cost about a microsecond:
//! workers spin on a generation counter for a while after each job and only
//! then sleep on a condition variable. The calling thread works too, so a
//! pool of `threads` has `threads - 1` workers.
//!
//! A job is a closure over task indices `0..tasks`; tasks are claimed with an
//! atomic counter, so uneven tasks balance themselves. Workers *join* a job
//! through a gate before touching it, and the caller closes the gate once
//! every task is claimed: it then waits only for workers that joined, never
//! for one that was asleep or descheduled and would have found nothing to
//! do. On a busy machine that is the difference between a few microseconds
//! and a scheduler time slice per kernel.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::threads_trace::JobTrace;

/// How long an idle worker spins before it sleeps. Kernels of one forward
/// pass follow each other within a few microseconds, so a short spin
/// catches the next one; longer gaps (sampling, scheduling) end in sleep.
/// Spinning longer hurts on a shared machine: a spinning worker takes CPU
/// time from the calling thread (measured on 2 busy cores: 300 µs of spin
/// made 2 threads slower than 1; 20-60 µs did not).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The gate packs the open job's id above [`GATE_COUNT_BITS`] bits counting
/// the workers that joined it; id 0 means closed.
const GATE_COUNT_BITS: u32 = 16;
const GATE_COUNT_MASK: u64 = (1 << GATE_COUNT_BITS) - 1;

/// A job as the workers see it: the caller's closure with its lifetime
/// erased (see the SAFETY argument in [`ThreadPool::run`]).
type ErasedJob = &'static (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped once per job; wakes workers, who then try the gate.
    generation: AtomicUsize,
    /// `job id << 16 | workers joined`, or 0 when no job is open.
    gate: AtomicU64,
    /// Joined workers that finished the current job.
    done: AtomicUsize,
    /// Written only by the dispatching thread while no worker has joined a
    /// job (the gate is closed and every joined worker is done), before the
    /// gate opens (Release); read by a worker only after it joined (Acquire).
    job: UnsafeCell<Option<ErasedJob>>,
    tasks: AtomicUsize,
    next_task: AtomicUsize,
    /// Workers sleeping (or about to) on `wake`; lets the dispatcher skip
    /// the mutex when every worker is spinning.
    sleeping: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    /// Per-job timings, when measuring (see `threads_trace`).
    trace: Option<JobTrace>,
}

// SAFETY: every field but `job` is a sync primitive. `job` is written only
// by the one thread holding `ThreadPool::dispatch` while no worker is inside
// a job, and published through the gate with Release/Acquire ordering; the
// closure it points to is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the erased closure reference is `Sync`, so sending the
// reference to other threads is sound.
unsafe impl Send for Shared {}

/// The gate id of the job announced by generation `generation`: never 0,
/// and distinct for 2⁴⁸ - 1 consecutive jobs.
fn job_id(generation: usize) -> u64 {
    (generation as u64 % ((1 << (64 - GATE_COUNT_BITS)) - 1)) + 1
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time; a second caller (or a nested call from inside a
    /// job) runs its tasks inline instead of waiting.
    dispatch: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs jobs on `threads` threads (the caller and
    /// `threads - 1` workers). `0` means the machine's available parallelism.
    pub fn new(threads: usize) -> ThreadPool {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        }
        .min(GATE_COUNT_MASK as usize);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            gate: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            tasks: AtomicUsize::new(0),
            next_task: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            trace: JobTrace::from_env(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for index in 1..threads {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("switchyard-cpu-{index}"))
                .spawn(move || worker_loop(&shared));
            match spawned {
                Ok(handle) => workers.push(handle),
                // Fewer workers only means less parallelism; the caller
                // always runs whatever tasks the workers do not claim.
                Err(err) => tracing::warn!("could not start CPU worker thread {index}: {err}"),
            }
        }
        ThreadPool {
            shared,
            workers,
            dispatch: Mutex::new(()),
        }
    }

    /// Threads that run a job (workers plus the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(i)` for every `i` in `0..tasks`, spread over the pool, and
    /// returns when all have finished. Tasks run in no particular order.
    ///
    /// # Panics
    /// Re-raises (as a new panic) a panic from any task, after every task
    /// has stopped.
    pub fn run(&self, tasks: usize, job: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if tasks == 1 || self.workers.is_empty() {
            (0..tasks).for_each(job);
            return;
        }
        let trace = self.shared.trace.as_ref();
        let start = trace.map_or(0, JobTrace::now);
        let _dispatch = match self.dispatch.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..tasks).for_each(job);
                return;
            }
        };
        let shared = &*self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call:
        // `CloseAndWait` (dropped before we return, even on unwind) closes
        // the gate and waits for every worker that joined, and a worker
        // touches the closure only after joining.
        let erased: ErasedJob = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(job)
        };
        // SAFETY: we hold `dispatch`, the gate is closed and the previous
        // job's joined workers are done, so no worker reads `job` now.
        unsafe { *shared.job.get() = Some(erased) };
        shared.tasks.store(tasks, Ordering::Relaxed);
        shared.next_task.store(0, Ordering::Relaxed);
        shared.done.store(0, Ordering::Relaxed);
        let generation = shared.generation.load(Ordering::Relaxed).wrapping_add(1);
        shared
            .gate
            .store(job_id(generation) << GATE_COUNT_BITS, Ordering::Release);
        shared.generation.store(generation, Ordering::SeqCst);
        if let Some(trace) = trace {
            trace.dispatched(start);
        }
        if shared.sleeping.load(Ordering::SeqCst) > 0 {
            let _lock = lock(&shared.sleep_lock);
            shared.wake.notify_all();
        }
        let close = CloseAndWait(shared);
        run_tasks(shared, job);
        let caller_done = trace.map_or(0, JobTrace::now);
        drop(close);
        if let Some(trace) = trace {
            trace.job_end(start, caller_done);
        }
        if shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU kernel task panicked on a worker thread (see the message above)");
        }
    }

    /// One job in two phases: `first(i)` for every `i` in `0..first_tasks`,
    /// then `second(j)` for every `j` in `0..second_tasks`, where no
    /// second-phase task starts before every first-phase task has finished.
    /// A phase boundary inside one job costs less than two jobs: no
    /// serial gap on the caller between them, no second wake-up.
    ///
    /// Tasks are claimed in index order, first phase first, so a thread
    /// that claims a second-phase task waits only for first-phase tasks
    /// other threads are running; run inline (one thread, nested call) the
    /// phases simply follow each other.
    ///
    /// # Panics
    /// As [`ThreadPool::run`]; a first-phase task that panics still counts
    /// as finished, so the second phase does not wait forever.
    pub fn run_phased(
        &self,
        first_tasks: usize,
        first: &(dyn Fn(usize) + Sync),
        second_tasks: usize,
        second: &(dyn Fn(usize) + Sync),
    ) {
        let finished = AtomicUsize::new(0);
        let trace = self.shared.trace.as_ref();
        self.run(first_tasks + second_tasks, &|i| {
            if i < first_tasks {
                let _count = CountOnDrop(&finished);
                first(i);
            } else {
                let since = trace.map_or(0, JobTrace::now);
                wait_for(&finished, first_tasks);
                if let Some(trace) = trace {
                    trace.waited_for_first_phase(since);
                }
                second(i - first_tasks);
            }
        });
    }

    /// Splits `0..len` into consecutive ranges of at most `chunk` (at least
    /// 1) and runs `job` on each range.
    pub fn for_each_range(
        &self,
        len: usize,
        chunk: usize,
        job: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) {
        let chunk = chunk.max(1);
        let tasks = len.div_ceil(chunk);
        self.run(tasks, &|task| {
            let start = task * chunk;
            job(start..(start + chunk).min(len));
        });
    }

    /// A chunk size that gives each thread about `per_thread` ranges of at
    /// least `min_chunk` items, for [`ThreadPool::for_each_range`].
    pub fn chunk_for(&self, len: usize, per_thread: usize, min_chunk: usize) -> usize {
        let pieces = (self.threads() * per_thread).max(1);
        len.div_ceil(pieces).max(min_chunk).max(1)
    }

    /// `range` cut into consecutive pieces for tasks, largest first: each
    /// takes about the rest over the thread count, kept within
    /// `min_chunk..=max_chunk` (guided self-scheduling). Each thread then
    /// works through long stretches of the range, and the small pieces at
    /// the end still even out the threads' finishing times. (A share of
    /// the rest over twice the thread count measured 2-4% slower at
    /// decode; see `matmul`.)
    pub fn guided_ranges(
        &self,
        range: std::ops::Range<usize>,
        min_chunk: usize,
        max_chunk: usize,
    ) -> GuidedRanges {
        let min = min_chunk.max(1);
        GuidedRanges {
            next: range.start,
            end: range.end,
            shares: self.threads(),
            min,
            max: max_chunk.max(min),
        }
    }
}

/// The pieces of [`ThreadPool::guided_ranges`], in order.
#[derive(Clone, Debug)]
pub struct GuidedRanges {
    next: usize,
    end: usize,
    shares: usize,
    min: usize,
    max: usize,
}

impl Iterator for GuidedRanges {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let left = self.end.checked_sub(self.next).filter(|&left| left > 0)?;
        let len = left
            .div_ceil(self.shares)
            .clamp(self.min, self.max)
            .min(left);
        let start = self.next;
        self.next += len;
        Some(start..self.next)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        if let Some(trace) = &self.shared.trace {
            // A measurement's output, asked for by the variable (a bench
            // has no log subscriber).
            eprintln!("{}", trace.summary());
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _lock = lock(&self.shared.sleep_lock);
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            // A worker that panicked already reported it through `panicked`.
            let _ = worker.join();
        }
    }
}

/// Adds one to its counter when dropped (also while unwinding).
struct CountOnDrop<'a>(&'a AtomicUsize);

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Spins until `counter` reaches `target`, yielding once the wait gets
/// long (the thread it waits for was descheduled). The clock is read once
/// per 64 spins, not per spin (`clock_gettime` showed in profiles of
/// batched decode), and not at all when the count is already there.
fn wait_for(counter: &AtomicUsize, target: usize) {
    if counter.load(Ordering::Acquire) >= target {
        return;
    }
    let started = Instant::now();
    let mut spins = 0u32;
    let mut long = false;
    while counter.load(Ordering::Acquire) < target {
        spins = spins.wrapping_add(1);
        if !long && spins.is_multiple_of(64) {
            long = started.elapsed() >= Duration::from_micros(50);
        }
        if long {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// On drop: closes the gate, then waits for the workers that joined.
struct CloseAndWait<'a>(&'a Shared);

impl Drop for CloseAndWait<'_> {
    fn drop(&mut self) {
        let joined = (self.0.gate.swap(0, Ordering::AcqRel) & GATE_COUNT_MASK) as usize;
        // Joined workers are running tasks right now.
        wait_for(&self.0.done, joined);
    }
}

fn run_tasks(shared: &Shared, job: &(dyn Fn(usize) + Sync)) {
    let tasks = shared.tasks.load(Ordering::Relaxed);
    loop {
        let task = shared.next_task.fetch_add(1, Ordering::Relaxed);
        if task >= tasks {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| job(task))).is_err() {
            shared.panicked.store(true, Ordering::Relaxed);
        }
    }
}

/// Joins the job with id `id` if its gate is still open.
fn try_join(shared: &Shared, id: u64) -> bool {
    let mut gate = shared.gate.load(Ordering::Acquire);
    loop {
        if gate >> GATE_COUNT_BITS != id {
            return false;
        }
        match shared
            .gate
            .compare_exchange_weak(gate, gate + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => gate = now,
        }
    }
}

fn worker_loop(shared: &Shared) {
    // Generation 0 is the pool's initial value, not a job; reading the
    // counter here instead could skip a job dispatched before this thread
    // started.
    let mut seen = 0;
    loop {
        seen = wait_for_new_generation(shared, seen);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        if !try_join(shared, job_id(seen)) {
            // The caller already finished that job without us.
            continue;
        }
        if let Some(trace) = &shared.trace {
            trace.joined();
        }
        // SAFETY: we joined an open gate (Acquire), which the dispatcher
        // opened (Release) after writing `job`; it will not write `job`
        // again before `done` counts us.
        let job = unsafe { *shared.job.get() };
        if let Some(job) = job {
            run_tasks(shared, job);
        }
        if let Some(trace) = &shared.trace {
            trace.worker_done();
        }
        shared.done.fetch_add(1, Ordering::Release);
    }
}

/// Spins, then sleeps, until `generation` differs from `seen`; returns it.
fn wait_for_new_generation(shared: &Shared, seen: usize) -> usize {
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        let current = shared.generation.load(Ordering::Acquire);
        if current != seen {
            return current;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(128) && started.elapsed() > SPIN_BEFORE_SLEEP {
            break;
        }
        std::hint::spin_loop();
    }
    let mut guard = lock(&shared.sleep_lock);
    // Announce sleeping before the final check (both SeqCst) so that a
    // dispatcher bumping `generation` concurrently either sees us sleeping
    // and notifies under the lock, or we see its bump here.
    shared.sleeping.fetch_add(1, Ordering::SeqCst);
    let mut current = shared.generation.load(Ordering::SeqCst);
    while current == seen {
        guard = shared
            .wake
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner);
        current = shared.generation.load(Ordering::SeqCst);
    }
    shared.sleeping.fetch_sub(1, Ordering::SeqCst);
    drop(guard);
    current
}

fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn check_every_task_once(threads: usize) {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.threads(), threads);
        for tasks in [0usize, 1, 2, 3, 7, 64, 1000] {
            let hits: Vec<AtomicU64> = (0..tasks).map(|_| AtomicU64::new(0)).collect();
            for _ in 0..20 {
                pool.run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 20));
        }
    }

    #[test]
    fn guided_ranges_cover_the_range_largest_first() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for (start, end, min, max) in [
                (0, 0, 2, 64),
                (5, 5, 2, 64),
                (0, 1, 2, 64),
                (0, 96, 2, 64),
                (8, 1000, 8, 1024),
                (0, 3072, 2, 64),
                (3, 40, 1, 1),
            ] {
                let pieces: Vec<_> = pool.guided_ranges(start..end, min, max).collect();
                let mut at = start;
                for piece in &pieces {
                    assert_eq!(
                        piece.start, at,
                        "{threads} threads, {start}..{end}: contiguous"
                    );
                    assert!(piece.len() <= max && !piece.is_empty());
                    // Only the last piece may be under the minimum.
                    assert!(piece.len() >= min || piece.end == end);
                    at = piece.end;
                }
                assert_eq!(at, end, "{threads} threads, {start}..{end}: covered");
                assert!(
                    pieces.windows(2).all(|w| w[0].len() >= w[1].len()),
                    "largest first: {pieces:?}"
                );
            }
        }
        // Two threads over 96 groups: half first, then ever smaller.
        let pool = ThreadPool::new(2);
        let lens: Vec<usize> = pool.guided_ranges(0..96, 2, 64).map(|r| r.len()).collect();
        assert_eq!(lens, [48, 24, 12, 6, 3, 2, 1]);
        // The cap holds back the first pieces of a long range.
        let lens: Vec<usize> = pool.guided_ranges(0..200, 2, 64).map(|r| r.len()).collect();
        assert_eq!(lens, [64, 64, 36, 18, 9, 5, 2, 2]);
    }

    #[test]
    fn runs_every_task_exactly_once_with_1_2_3_threads() {
        for threads in 1..=3 {
            check_every_task_once(threads);
        }
    }

    #[test]
    fn wakes_sleeping_workers() {
        let pool = ThreadPool::new(3);
        let sum = AtomicU64::new(0);
        for round in 0..3 {
            std::thread::sleep(SPIN_BEFORE_SLEEP * 4);
            pool.run(10, &|i| {
                sum.fetch_add(i as u64 + round, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 3 * 45 + 10 * 3);
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = ThreadPool::new(2);
        let count = AtomicU64::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn second_phase_sees_every_first_phase_result() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for (first, second) in [(0usize, 5usize), (1, 1), (3, 0), (7, 64), (64, 7)] {
                for _ in 0..20 {
                    let written: Vec<AtomicU64> = (0..first).map(|_| AtomicU64::new(0)).collect();
                    let seen = AtomicU64::new(0);
                    let runs = AtomicU64::new(0);
                    pool.run_phased(
                        first,
                        &|i| {
                            // A slow first task, so a second-phase task
                            // that did not wait would see it unwritten.
                            if i == 0 {
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            written[i].store(i as u64 + 1, Ordering::Relaxed);
                        },
                        second,
                        &|_| {
                            let sum: u64 = written.iter().map(|w| w.load(Ordering::Relaxed)).sum();
                            seen.fetch_add(sum, Ordering::Relaxed);
                            runs.fetch_add(1, Ordering::Relaxed);
                        },
                    );
                    let all = (first as u64) * (first as u64 + 1) / 2;
                    assert_eq!(runs.load(Ordering::Relaxed), second as u64);
                    assert_eq!(seen.load(Ordering::Relaxed), all * second as u64);
                }
            }
        }
    }

    #[test]
    fn a_panicking_first_phase_does_not_hang_the_second() {
        let pool = ThreadPool::new(2);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run_phased(
                4,
                &|i| assert_ne!(i, 2, "task two fails on purpose"),
                4,
                &|_| {},
            )
        }));
        assert!(result.is_err());
    }

    #[test]
    fn task_panic_is_reraised_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|i| {
                if i == 5 {
                    panic!("task five fails on purpose");
                }
            })
        }));
        assert!(result.is_err());
        let count = AtomicU64::new(0);
        pool.run(8, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }
}
