//! Activation quantization: the numeric contract of quantized matmuls.
//!
//! Each activation row is cut into blocks of 32; per block
//! `amax = max|x_i|`, `d = amax / 127`, `id = 1/d` (0 when `d == 0`) and
//! `q_i = round_ties_even(x_i · id)` as i8. Every ISA produces bit-identical
//! blocks: the same f32 multiply, and `cvtps2dq` rounds to nearest even
//! under the default MXCSR. Each block also carries `s = d · Σq_i`, which
//! the dot products of types with a per-block offset (Q4_1's `m`, Q4_0's
//! `-8`, Q4_K's mins) multiply by that offset.
//!
//! For the AVX-512 kernels each row also carries the block scales *spread*
//! over vector lanes (see [`QuantizedRows::quantize`]), so that a kernel
//! multiplies by them straight from memory instead of shuffling them into
//! place once per weight row.

use super::disjoint::DisjointSlice;
use super::isa::CheckedIsa;
use super::Isa;
use crate::formats::blocks::QK;

/// Quantized activation rows, reused between calls to avoid allocation.
#[derive(Default)]
pub(crate) struct QuantizedRows {
    k: usize,
    qs: Vec<i8>,
    /// Per block, `[d, d · Σq]`, interleaved so SIMD kernels load both.
    ds: Vec<f32>,
    /// Per block, the exact `Σq`: the repacked kernels fold an integer
    /// weight offset (Q4_0's 8, Q8_0's 128) into the integer sum with it.
    sums: Vec<i32>,
    /// Per block, `Σq` over its first and its last 16 elements: Q6_K's
    /// scales cover 16 elements, and its group kernel takes its offset
    /// (32) off each half's integer sum.
    half_sums: Vec<i32>,
    /// Per row, per pair of blocks `(b, b+1)`: 32 floats `[d_b ×8,
    /// d_b+1 ×8, s_b/8 ×8, s_b+1/8 ×8]` (zeros for a missing last block).
    /// Only filled for AVX-512; empty otherwise.
    spread: Vec<f32>,
    spread_per_row: usize,
}

/// One quantized row: `qs.len() == k`, `ds.len() == 2 · k / 32`,
/// `sums.len() == k / 32`, `half_sums.len() == 2 · k / 32`, `spread.len()` either 0 or
/// [`spread_len`]`(k / 32)`.
#[derive(Clone, Copy)]
pub(crate) struct QRow<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) ds: &'a [f32],
    pub(crate) sums: &'a [i32],
    pub(crate) half_sums: &'a [i32],
    pub(crate) spread: &'a [f32],
}

/// Floats of spread scales for a row of `blocks` blocks.
pub(crate) fn spread_len(blocks: usize) -> usize {
    blocks.div_ceil(2) * 32
}

impl QuantizedRows {
    /// Sizes the buffers for `rows` rows of `k` elements (`k % 32 == 0`:
    /// the caller validated it) and lends them as [`SharedRows`], whose
    /// rows the tasks of one pool job quantize in parallel. Grows the
    /// buffers but never clears them: every row is rewritten.
    pub(crate) fn shared(&mut self, isa: CheckedIsa, rows: usize, k: usize) -> SharedRows<'_> {
        let blocks = k / QK;
        self.k = k;
        self.spread_per_row = if isa.get() >= Isa::Avx512 {
            spread_len(blocks)
        } else {
            0
        };
        // Grown, never shrunk: a row is found by its offset, and a step's
        // products alternate between widths (Q/K/V's and down's), each
        // shrink-and-regrow rewriting the difference with zeros.
        grow(&mut self.qs, rows * k);
        grow(&mut self.ds, rows * 2 * blocks);
        grow(&mut self.sums, rows * blocks);
        grow(&mut self.half_sums, rows * 2 * blocks);
        grow(&mut self.spread, rows * self.spread_per_row);
        SharedRows {
            isa,
            k,
            spread_per_row: self.spread_per_row,
            qs: DisjointSlice::new(&mut self.qs),
            ds: DisjointSlice::new(&mut self.ds),
            sums: DisjointSlice::new(&mut self.sums),
            half_sums: DisjointSlice::new(&mut self.half_sums),
            spread: DisjointSlice::new(&mut self.spread),
        }
    }

    /// Quantizes `rows` rows of `k` elements on the calling thread
    /// (`x.len() == rows · k`).
    #[cfg(test)]
    pub(crate) fn quantize(&mut self, isa: CheckedIsa, x: &[f32], rows: usize, k: usize) {
        let shared = self.shared(isa, rows, k);
        for (r, x) in x.chunks_exact(k).take(rows).enumerate() {
            // SAFETY: one thread, one row at a time, no reader yet.
            unsafe { shared.quantize_row(r, x) };
        }
    }

    /// Row `r` (the caller keeps `r` below the quantized row count).
    #[cfg(test)]
    pub(crate) fn row(&self, r: usize) -> QRow<'_> {
        let blocks = self.k / QK;
        let spread = self.spread_per_row;
        QRow {
            qs: &self.qs[r * self.k..(r + 1) * self.k],
            ds: &self.ds[r * 2 * blocks..(r + 1) * 2 * blocks],
            sums: &self.sums[r * blocks..(r + 1) * blocks],
            half_sums: &self.half_sums[r * 2 * blocks..(r + 1) * 2 * blocks],
            spread: &self.spread[r * spread..(r + 1) * spread],
        }
    }
}

/// `v` at least `len` long (new elements zero).
fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// Quantized rows being written, then read, by the tasks of one pool job:
/// its first phase quantizes rows (each row by one task), its second reads
/// them all (see `ThreadPool::run_phased`).
pub(crate) struct SharedRows<'a> {
    isa: CheckedIsa,
    k: usize,
    spread_per_row: usize,
    qs: DisjointSlice<'a, i8>,
    ds: DisjointSlice<'a, f32>,
    sums: DisjointSlice<'a, i32>,
    half_sums: DisjointSlice<'a, i32>,
    spread: DisjointSlice<'a, f32>,
}

impl SharedRows<'_> {
    /// Quantizes `x` (`k` floats) into row `r`, spread scales included.
    ///
    /// # Safety
    /// No other thread may touch row `r` meanwhile, and no [`QRow`] may be
    /// live.
    pub(crate) unsafe fn quantize_row(&self, r: usize, x: &[f32]) {
        let blocks = self.k / QK;
        // SAFETY: row r's parts, which the caller holds alone.
        let (q, ds, sums) = unsafe {
            (
                self.qs.range(r * self.k, self.k),
                self.ds.range(r * 2 * blocks, 2 * blocks),
                self.sums.range(r * blocks, blocks),
            )
        };
        // SAFETY: as above.
        let halves = unsafe { self.half_sums.range(r * 2 * blocks, 2 * blocks) };
        quantize_blocks(self.isa, &x[..self.k], q, ds, sums, halves);
        if self.spread_per_row > 0 {
            // SAFETY: as above.
            let spread = unsafe {
                self.spread
                    .range(r * self.spread_per_row, self.spread_per_row)
            };
            fill_spread(ds, spread);
        }
    }

    /// Row `r`. Inlined and unchecked: the group kernels' tile walk builds
    /// eight of these per tile and block of groups.
    ///
    /// # Safety
    /// `r` is below the row count given to [`QuantizedRows::shared`], row
    /// `r` was quantized, and no thread writes any row while the result
    /// lives.
    #[inline(always)]
    pub(crate) unsafe fn row(&self, r: usize) -> QRow<'_> {
        let blocks = self.k / QK;
        let spread = self.spread_per_row;
        // SAFETY: the caller's promises; the ranges are row r's, inside
        // buffers sized for every row by `shared`.
        unsafe {
            QRow {
                qs: self.qs.get_unchecked(r * self.k, self.k),
                ds: self.ds.get_unchecked(r * 2 * blocks, 2 * blocks),
                sums: self.sums.get_unchecked(r * blocks, blocks),
                half_sums: self.half_sums.get_unchecked(r * 2 * blocks, 2 * blocks),
                spread: self.spread.get_unchecked(r * spread, spread),
            }
        }
    }
}

/// Spreads one row's block scales `ds` (`[d, s]` per block) over
/// `spread`, a pair of blocks `(b, b+1)` as 32 floats `[d_b ×8, d_b+1 ×8,
/// s_b/8 ×8, s_b+1/8 ×8]`, zeros for a missing last block. The `s/8` makes
/// a kernel's eight lanes of `m · s/8` sum to `m · s` (exact: a power of
/// 2).
fn fill_spread(ds: &[f32], spread: &mut [f32]) {
    for (pair, out) in ds.chunks(4).zip(spread.chunks_exact_mut(32)) {
        let second = |i: usize| pair.get(2 + i).copied().unwrap_or(0.0);
        out[..8].fill(pair[0]);
        out[8..16].fill(second(0));
        out[16..24].fill(pair[1] / 8.0);
        out[24..].fill(second(1) / 8.0);
    }
}

/// Quantizes whole blocks: `x.len() == q.len() == 16 · ds.len() == 32 ·
/// sums.len()`.
pub(crate) fn quantize_blocks(
    isa: CheckedIsa,
    x: &[f32],
    q: &mut [i8],
    ds: &mut [f32],
    sums: &mut [i32],
    half_sums: &mut [i32],
) {
    let blocks = x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(ds.chunks_exact_mut(2))
        .zip(sums.iter_mut().zip(half_sums.chunks_exact_mut(2)));
    for (((x, q), ds), (sum, halves)) in blocks {
        let (d, [h0, h1]) = match isa.get() {
            Isa::Scalar => quantize_block_scalar(x, q),
            // SAFETY: a CheckedIsa of Avx2 or above means AVX2 was detected;
            // the slices are exactly 32 long.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::quantize_block_avx2(x.as_ptr(), q.as_mut_ptr()) },
            // SAFETY: AVX-512 F/BW were detected; slices are 32 long.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Vnni => unsafe {
                x86::quantize_block_avx512(x.as_ptr(), q.as_mut_ptr())
            },
            // NEON and other architectures' levels: the scalar code.
            _ => quantize_block_scalar(x, q),
        };
        let total = h0 + h1;
        ds[0] = d;
        ds[1] = d * total as f32;
        *sum = total;
        halves.copy_from_slice(&[h0, h1]);
    }
}

/// The reference: one block of 32, returning `d` and the sums of the
/// quants of each half (`Σq[..16]`, `Σq[16..]`).
pub(crate) fn quantize_block_scalar(x: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut halves = [0i32; 2];
    for (i, (q, v)) in q.iter_mut().zip(x).enumerate() {
        let r = (v * id).round_ties_even() as i8;
        *q = r;
        halves[i / (QK / 2)] += i32::from(r);
    }
    (d, halves)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 must be available; `x` and `q` must point at 32 elements.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_block_avx2(x: *const f32, q: *mut i8) -> (f32, [i32; 2]) {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let a = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let mut m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        let amax = _mm_cvtss_f32(m);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let i = [
            _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id)),
            _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id)),
        ];
        // packs works within 128-bit lanes; the permute puts the 32 bytes
        // back in element order.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256(q.cast(), _mm256_permutevar8x32_epi32(packed, order));
        let sum = |v: __m256i| {
            let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
            let t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
            _mm_cvtsi128_si32(t)
        };
        let halves = [
            sum(_mm256_add_epi32(i[0], i[1])),
            sum(_mm256_add_epi32(i[2], i[3])),
        ];
        (d, halves)
    }

    /// # Safety
    /// AVX-512 F must be available; `x` and `q` must point at 32 elements.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_block_avx512(x: *const f32, q: *mut i8) -> (f32, [i32; 2]) {
        let v0 = _mm512_loadu_ps(x);
        let v1 = _mm512_loadu_ps(x.add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
        let i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        _mm_storeu_si128(q.cast(), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128(q.add(16).cast(), _mm512_cvtsepi32_epi8(i1));
        (
            d,
            [_mm512_reduce_add_epi32(i0), _mm512_reduce_add_epi32(i1)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn scalar_contract_by_hand() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = -63.5; // exactly half-way: ties to even -> -64
        x[2] = 0.5; // ties to even -> 0
        x[3] = 1.5; // -> 2
        let mut q = [0i8; 32];
        x[20] = -3.0;
        let (d, halves) = quantize_block_scalar(&x, &mut q);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..4], &[127, -64, 0, 2]);
        assert_eq!(halves, [127 - 64 + 2, -3]);
        let (d, halves) = quantize_block_scalar(&[0.0; 32], &mut q);
        assert_eq!((d, halves), (0.0, [0, 0]));
        assert!(q.iter().all(|v| *v == 0));
    }

    #[test]
    fn every_isa_quantizes_bit_identically() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let blocks = 64;
        let mut x: Vec<f32> = (0..blocks * QK)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        // Exact ties and an all-zero block.
        x[..QK]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 15.5);
        x[QK..2 * QK].iter_mut().for_each(|v| *v = 0.0);
        let mut want_q = vec![0i8; x.len()];
        let mut want_ds = vec![0.0f32; blocks * 2];
        let mut want_sums = vec![0i32; blocks];
        let mut want_halves = vec![0i32; 2 * blocks];
        quantize_blocks(
            CheckedIsa::at_most(Isa::Scalar),
            &x,
            &mut want_q,
            &mut want_ds,
            &mut want_sums,
            &mut want_halves,
        );
        for ((q, s), h) in want_q.chunks(QK).zip(&want_sums).zip(want_halves.chunks(2)) {
            let half = |r: &[i8]| r.iter().map(|&v| i32::from(v)).sum::<i32>();
            assert_eq!([half(&q[..QK / 2]), half(&q[QK / 2..])], h);
            assert_eq!(h[0] + h[1], *s);
        }
        for isa in Isa::supported() {
            let mut q = vec![0i8; x.len()];
            let mut ds = vec![0.0f32; blocks * 2];
            let mut sums = vec![0i32; blocks];
            let mut halves = vec![0i32; 2 * blocks];
            let isa_at_most = CheckedIsa::at_most(isa);
            quantize_blocks(isa_at_most, &x, &mut q, &mut ds, &mut sums, &mut halves);
            assert_eq!(q, want_q, "{isa}");
            assert_eq!(ds, want_ds, "{isa}");
            assert_eq!(sums, want_sums, "{isa}");
            assert_eq!(halves, want_halves, "{isa}");
            println!("quantization bit-identical on {isa}");
        }
    }
}
