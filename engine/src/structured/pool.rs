//! The threads grammars are compiled on: few, with a large stack, shared by
//! every checkpoint.
//!
//! llguidance compiles a schema recursively. On a tokio worker (2 MiB of
//! stack) a deep enough schema overflowed it and aborted the whole server;
//! here the stack is sized for the largest schema [`super::limits`] accept,
//! with a wide margin, and the number of threads bounds how many cores
//! compiles can take from decoding at once. The caller blocks until its
//! grammar is compiled, so it must not be an async worker (the router
//! submits constrained requests from its blocking pool).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};

/// Stack of a compile thread. Reserved address space, touched only as deep
/// as a compile goes; the deepest schema within the limits uses a few MiB.
const STACK_BYTES: usize = 256 * 1024 * 1024;
/// Compiles that run at once (half the cores, at least one); more wait their turn.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `compile` on a compile thread and returns what it returned, or why it
/// could not (a panic inside the grammar engine, no thread to run it).
pub fn run<T: Send + 'static>(compile: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (reply, answer) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let outcome = catch_unwind(AssertUnwindSafe(compile))
            .map_err(|_| "the grammar engine failed on this schema".to_owned());
        // The caller waits for this reply; if it is gone there is no one to tell.
        let _ = reply.send(outcome);
    });
    let queue = queue().as_ref().map_err(Clone::clone)?;
    let sent = queue
        .lock()
        .map_err(|_| "the grammar compile queue is unusable".to_owned())?
        .send(job);
    sent.map_err(|_| "the grammar compile threads have stopped".to_owned())?;
    answer
        .recv()
        .map_err(|_| "the grammar compile thread stopped".to_owned())?
}

/// The queue into the compile threads, started on first use.
fn queue() -> &'static Result<Mutex<SyncSender<Job>>, String> {
    static QUEUE: OnceLock<Result<Mutex<SyncSender<Job>>, String>> = OnceLock::new();
    QUEUE.get_or_init(start)
}

fn start() -> Result<Mutex<SyncSender<Job>>, String> {
    // A rendezvous-sized queue would block callers while the threads work;
    // callers block on their answer anyway, so a few slots are plenty.
    let (sender, jobs) = mpsc::sync_channel::<Job>(64);
    let jobs = Arc::new(Mutex::new(jobs));
    for i in 0..threads() {
        let jobs = Arc::clone(&jobs);
        std::thread::Builder::new()
            .name(format!("grammar-compile-{i}"))
            .stack_size(STACK_BYTES)
            .spawn(move || work(&jobs))
            .map_err(|e| format!("cannot start a grammar compile thread: {e}"))?;
    }
    Ok(Mutex::new(sender))
}

fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only to take the next job, not while it runs.
        let job = match jobs.lock() {
            Ok(jobs) => jobs.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::run;

    #[test]
    fn runs_jobs_and_reports_panics() {
        assert_eq!(run(|| 6 * 7), Ok(42));
        let failed = run(|| -> u32 { panic!("boom") });
        assert!(failed.unwrap_err().contains("failed"));
        assert_eq!(run(|| 1), Ok(1), "a panic does not take a thread down");
    }

    #[test]
    fn the_stack_takes_deep_recursion() {
        fn depth(n: u64) -> u64 {
            let pad = std::hint::black_box([0u8; 1024]);
            if n == 0 {
                u64::from(pad[0])
            } else {
                1 + depth(n - 1)
            }
        }
        // About 20 MiB of frames: ten times a tokio worker's stack.
        assert_eq!(run(|| depth(20_000)), Ok(20_000));
    }
}
