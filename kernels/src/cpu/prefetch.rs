//! Software prefetch of a whole buffer a task is about to read.
//!
//! A decode step's attention task reads one KV head of one sequence: a few
//! KB of keys and values that the step's ~100 MB of weights evicted from
//! every cache since the last step. Read in order, each short stream
//! waits on DRAM until the hardware prefetchers catch on; asking for every
//! line at once lets the misses overlap.

/// Asks for every cache line of `data` (a hint: no effect on results,
/// never faults; nothing on ISAs without a prefetch here).
pub(crate) fn prefetch_all<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = data.as_ptr().cast::<i8>();
        for offset in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: SSE is part of x86_64; a prefetch reads nothing the
            // program sees and cannot fault. The address is inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// What the caller of an attention call multiplies next (a layer's O
/// product, then gate/up), fetched into L2 while the attention's
/// arithmetic runs.
///
/// At depth a decode step's attention is bound by its arithmetic (the
/// F16 widening and three heads' multiply-adds per key) while the weight
/// products after it are bound by their reads: one after the other, the
/// load ports idle during one and the FMA ports during the other. Each
/// folded key block asks for a few lines of the weights ([`Upcoming::step`]),
/// so the products then read from L2.
///
/// The pool hands out tasks dynamically, so which thread multiplies which
/// rows is not fixed; but a product's tasks are largest first (half the
/// matrix, then a quarter, ...) and the worker, idle while the caller
/// makes the product's input, claims the first: the worker asks for the
/// first half of each matrix, the caller for the second.
pub(crate) struct Upcoming<'a> {
    parts: &'a [&'a [u8]],
    /// Tells one call's cursors from the last call's.
    call: u64,
    /// Lines one [`Upcoming::step`] asks for.
    per_step: usize,
    threads: usize,
    share: Share,
}

/// Which lines of each part a thread asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Share {
    /// Every line, on every thread.
    All,
    /// A thread's part of each matrix (see [`Upcoming`]).
    Halves,
}

const LINE: usize = 64;

/// Every call gets a new id, so a thread's cursor from the last call is
/// never taken for this one's.
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// (call id, lines of this thread's share asked for so far).
    static CURSOR: std::cell::Cell<(u64, usize)> = const { std::cell::Cell::new((0, 0)) };
}

impl<'a> Upcoming<'a> {
    /// `parts` spread over `steps` calls of [`Upcoming::step`] per thread
    /// (on `threads` threads), at most `cap` lines a step.
    pub(crate) fn new(
        parts: &'a [&'a [u8]],
        threads: usize,
        steps: usize,
        cap: usize,
        share: Share,
    ) -> Upcoming<'a> {
        let threads = threads.max(1);
        let mut up = Upcoming {
            parts,
            call: CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            per_step: 0,
            threads,
            share,
        };
        let lines: usize = (0..parts.len()).map(|p| up.range(p, 0).len()).sum();
        up.per_step = lines.div_ceil(steps.max(1)).min(cap);
        up
    }

    /// The lines of part `p` that the thread of pool index `thread` asks for.
    fn range(&self, p: usize, thread: usize) -> std::ops::Range<usize> {
        let lines = self.parts[p].len().div_ceil(LINE);
        match self.share {
            Share::All => 0..lines,
            Share::Halves => {
                let n = self.threads;
                let s = (thread + n - 1) % n;
                lines * s / n..lines * (s + 1) / n
            }
        }
    }

    /// Asks for the next lines of this thread's share, into L2.
    pub(crate) fn step(&self) {
        if self.per_step == 0 {
            return;
        }
        let thread = super::threads::thread_index() % self.threads;
        let (call, mut done) = CURSOR.get();
        if call != self.call {
            done = 0;
        }
        let mut left = self.per_step;
        let mut skip = done;
        for p in 0..self.parts.len() {
            let range = self.range(p, thread);
            if skip >= range.len() {
                skip -= range.len();
                continue;
            }
            let from = range.start + skip;
            let to = (from + left).min(range.end);
            fetch_l2(&self.parts[p][from * LINE..], to - from);
            left -= to - from;
            skip = 0;
            if left == 0 {
                break;
            }
        }
        CURSOR.set((self.call, done + self.per_step - left));
    }
}

/// Asks for the first `lines` lines of `data` into L2.
fn fetch_l2(data: &[u8], lines: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let start = data.as_ptr().cast::<i8>();
        for line in 0..lines {
            // SAFETY: SSE is part of x86_64; a prefetch reads nothing the
            // program sees and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(line * LINE)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, lines);
}
