//! Where a pool's jobs spend the threads' time, for measurements: with
//! `SWITCHYARD_POOL_TRACE` set when a pool starts, each job dispatched to
//! the workers records the caller's setup before the workers can see it,
//! how late a worker joins, how long second-phase tasks wait for a phased
//! job's first phase, each side's idle time at the job's end, and the
//! caller's time between one job's end and the next job's start (the
//! workers' idle time outside jobs). The sums and means go to stderr when
//! the pool drops. Jobs of a millisecond or more (a prompt's) are left
//! out. Without the variable the pool holds no trace and each event is
//! one `Option` test.
//!
//! Times are nanoseconds since the pool started. A single-stream decode
//! step dispatches ~150 jobs; with two threads there is one worker, and
//! "the worker's end" is the last worker's.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The environment variable that turns tracing on for pools made after it.
pub const POOL_TRACE_VAR: &str = "SWITCHYARD_POOL_TRACE";

/// Jobs and gaps between jobs longer than this are left out: a prompt's
/// jobs (a bench that fills a deep context first runs a few hundred of
/// them), and the time between decode steps or runs (sampling, setup).
const LONG_NS: u64 = 1_000_000;

pub(crate) struct JobTrace {
    origin: Instant,
    /// When the current job became visible to the workers.
    dispatched: AtomicU64,
    /// When the first worker joined the current job (0: none yet).
    joined_at: AtomicU64,
    /// When the last worker that joined the current job ran out of tasks
    /// (0: none yet).
    worker_end: AtomicU64,
    last_end: AtomicU64,
    jobs: AtomicU64,
    job_ns: AtomicU64,
    setup_ns: AtomicU64,
    joins: AtomicU64,
    join_ns: AtomicU64,
    phase_waits: AtomicU64,
    phase_wait_ns: AtomicU64,
    caller_tail_ns: AtomicU64,
    worker_tail_ns: AtomicU64,
    gaps: AtomicU64,
    gap_ns: AtomicU64,
}

impl JobTrace {
    /// A trace when [`POOL_TRACE_VAR`] is set.
    pub(crate) fn from_env() -> Option<JobTrace> {
        std::env::var_os(POOL_TRACE_VAR)?;
        Some(JobTrace::new())
    }

    fn new() -> JobTrace {
        let zero = || AtomicU64::new(0);
        JobTrace {
            origin: Instant::now(),
            dispatched: zero(),
            joined_at: zero(),
            worker_end: zero(),
            last_end: zero(),
            jobs: zero(),
            job_ns: zero(),
            setup_ns: zero(),
            joins: zero(),
            join_ns: zero(),
            phase_waits: zero(),
            phase_wait_ns: zero(),
            caller_tail_ns: zero(),
            worker_tail_ns: zero(),
            gaps: zero(),
            gap_ns: zero(),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The caller made the job (entered at `start`) visible to the workers.
    pub(crate) fn dispatched(&self, start: u64) {
        self.record_dispatch(start, self.now());
    }

    /// [`Self::dispatched`] at a given time (the tests give their own).
    fn record_dispatch(&self, start: u64, now: u64) {
        self.setup_ns.fetch_add(now.saturating_sub(start), Relaxed);
        self.dispatched.store(now, Relaxed);
        self.joined_at.store(0, Relaxed);
        self.worker_end.store(0, Relaxed);
    }

    /// A worker joined the current job.
    pub(crate) fn joined(&self) {
        self.record_join(self.now());
    }

    /// [`Self::joined`] at a given time (the tests give their own).
    fn record_join(&self, now: u64) {
        let _ = self.joined_at.compare_exchange(0, now, Relaxed, Relaxed);
    }

    /// A worker ran out of the current job's tasks.
    pub(crate) fn worker_done(&self) {
        self.record_worker_done(self.now());
    }

    /// [`Self::worker_done`] at a given time (the tests give their own).
    fn record_worker_done(&self, now: u64) {
        self.worker_end.fetch_max(now, Relaxed);
    }

    /// A second-phase task waited from `since` for the first phase.
    pub(crate) fn waited_for_first_phase(&self, since: u64) {
        self.phase_waits.fetch_add(1, Relaxed);
        self.phase_wait_ns
            .fetch_add(self.now().saturating_sub(since), Relaxed);
    }

    /// The job the caller entered at `start` ended; the caller ran out of
    /// tasks at `caller_done`.
    pub(crate) fn job_end(&self, start: u64, caller_done: u64) {
        self.record_job_end(start, caller_done, self.now());
    }

    /// [`Self::job_end`] at a given time (the tests give their own).
    fn record_job_end(&self, start: u64, caller_done: u64, end: u64) {
        let last = self.last_end.swap(end, Relaxed);
        if end.saturating_sub(start) >= LONG_NS {
            return;
        }
        self.jobs.fetch_add(1, Relaxed);
        self.job_ns.fetch_add(end.saturating_sub(start), Relaxed);
        self.caller_tail_ns
            .fetch_add(end.saturating_sub(caller_done), Relaxed);
        let joined_at = self.joined_at.load(Relaxed);
        if joined_at > 0 {
            self.joins.fetch_add(1, Relaxed);
            self.join_ns.fetch_add(
                joined_at.saturating_sub(self.dispatched.load(Relaxed)),
                Relaxed,
            );
        }
        let worker_end = self.worker_end.load(Relaxed);
        if worker_end > 0 {
            self.worker_tail_ns
                .fetch_add(caller_done.saturating_sub(worker_end), Relaxed);
        }
        let gap = start.saturating_sub(last);
        if last > 0 && gap < LONG_NS {
            self.gaps.fetch_add(1, Relaxed);
            self.gap_ns.fetch_add(gap, Relaxed);
        }
    }

    /// The means per job, in microseconds, as one line.
    pub(crate) fn summary(&self) -> String {
        let mean = |ns: &AtomicU64, n: &AtomicU64| {
            ns.load(Relaxed) as f64 / 1e3 / n.load(Relaxed).max(1) as f64
        };
        let jobs = self.jobs.load(Relaxed).max(1) as f64;
        format!(
            "pool trace: {} jobs; per job, µs: job {:.2}, caller's setup {:.2}, first worker joins after {:.2} \
             ({} jobs joined), second-phase tasks wait for the first phase {:.2} in all ({:.2} tasks of {:.3}), \
             caller waits at the end {:.2}, worker idle at the end {:.2}, caller between jobs {:.2} ({} gaps)",
            self.jobs.load(Relaxed),
            mean(&self.job_ns, &self.jobs),
            mean(&self.setup_ns, &self.jobs),
            mean(&self.join_ns, &self.joins),
            self.joins.load(Relaxed),
            self.phase_wait_ns.load(Relaxed) as f64 / 1e3 / jobs,
            self.phase_waits.load(Relaxed) as f64 / jobs,
            mean(&self.phase_wait_ns, &self.phase_waits),
            mean(&self.caller_tail_ns, &self.jobs),
            mean(&self.worker_tail_ns, &self.jobs),
            mean(&self.gap_ns, &self.gaps),
            self.gaps.load(Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's time runs from the caller's start to its end, its join and
    /// its worker's end fall inside it, a job of a millisecond or more is
    /// left out, and the gap before the next job counts. The events carry
    /// their own times (µs below), so the host's scheduling cannot move them.
    #[test]
    fn jobs_are_timed_and_long_ones_left_out() {
        let t = JobTrace::new();
        let us = |n: u64| n * 1_000;
        let job = |start: u64, worker: bool, length: u64| {
            t.record_dispatch(us(start), us(start + 1));
            if worker {
                t.record_join(us(start + 2));
                t.record_worker_done(us(start + length - 1));
            }
            t.record_job_end(us(start), us(start + length), us(start + length));
        };
        job(100, true, 200);
        job(400, false, 1_100);
        job(1_510, false, 10);
        assert_eq!(t.jobs.load(Relaxed), 2);
        assert_eq!(t.job_ns.load(Relaxed), us(210));
        assert_eq!(t.setup_ns.load(Relaxed), us(3));
        assert_eq!(t.joins.load(Relaxed), 1);
        assert_eq!(t.join_ns.load(Relaxed), us(1));
        assert_eq!(t.worker_tail_ns.load(Relaxed), us(1));
        // The first job had none before it; the third's follows the
        // long one's end.
        assert_eq!(t.gaps.load(Relaxed), 1);
        assert_eq!(t.gap_ns.load(Relaxed), us(10));
        assert!(t.summary().starts_with("pool trace: 2 jobs;"));
    }
}
