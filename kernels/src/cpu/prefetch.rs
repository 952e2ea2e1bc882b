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
