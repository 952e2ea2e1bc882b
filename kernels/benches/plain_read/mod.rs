//! The roofline program's read kernel for the benches that set a kernel
//! against a plain read of as many bytes on as many threads: 64-byte
//! AVX-512 loads into eight accumulators, each thread reading its share
//! of the buffer again and again.

use std::time::Instant;

/// Sums the buffer with 64-byte loads into eight accumulators.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(bytes: &[u8]) -> i64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 8];
    let chunks = bytes.chunks_exact(512);
    for chunk in chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: 64 bytes at 64·k of a 512-byte chunk.
            let v = unsafe { _mm512_loadu_si512(chunk.as_ptr().add(64 * k).cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let mut total = _mm512_setzero_si512();
    for a in acc {
        total = _mm512_add_epi64(total, a);
    }
    _mm512_reduce_add_epi64(total)
}

fn read(bytes: &[u8]) -> i64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F detected.
        return unsafe { read_avx512(bytes) };
    }
    bytes.iter().map(|b| i64::from(*b)).sum()
}

/// GB/s of reading `buffer` on `threads` threads, each its share again
/// and again, at least `min_bytes` in all (as the roofline program's
/// `MIN_TIMED_BYTES`: a few passes of a small buffer last a scheduler
/// tick or two), the threads started once for the whole timing.
pub fn plain_read(buffer: &[u8], threads: usize, min_bytes: usize) -> f64 {
    let share = buffer.len().div_ceil(threads);
    let passes = min_bytes.div_ceil(buffer.len().max(1));
    let start = Instant::now();
    let sink = std::thread::scope(|s| {
        let handles: Vec<_> = buffer
            .chunks(share)
            .map(|part| {
                s.spawn(move || (0..passes).fold(0, |a, _| a ^ read(std::hint::black_box(part))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a read thread does not panic"))
            .fold(0, |a, b| a ^ b)
    });
    std::hint::black_box(sink);
    (passes * buffer.len()) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// `median (min-max)` of `v` (not empty), one decimal.
pub fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!("{:.1} ({:.1}-{:.1})", v[v.len() / 2], v[0], v[v.len() - 1])
}
