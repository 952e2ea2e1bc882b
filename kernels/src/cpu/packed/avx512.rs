//! The group kernels on AVX-512 VNNI: one `vpdpbusd` adds four products
//! to each of sixteen row sums. See the module documentation for the
//! layout and the contract `scalar` spells out.
//!
//! # Safety
//! Every function needs AVX-512 F/BW/VNNI and F16C, a `group` in the
//! layout of `blocks` blocks, and activation rows of `blocks` blocks.

use std::arch::x86_64::*;

use super::{part_offsets, quant_bytes, quant_offset, GROUP_ROWS};
use crate::cpu::blocks::QK;
use crate::cpu::quant_act::QRow;
use crate::DType;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_group<const T: usize>(
    dtype: DType,
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    // SAFETY (all arms): forwarded preconditions.
    unsafe {
        match dtype {
            DType::Q4_1 => dot_nibbles::<T, true, false>(group, blocks, a, out, accumulate),
            DType::Q4_0 => dot_nibbles::<T, false, false>(group, blocks, a, out, accumulate),
            DType::Q5_1 => dot_nibbles::<T, true, true>(group, blocks, a, out, accumulate),
            DType::Q5_0 => dot_nibbles::<T, false, true>(group, blocks, a, out, accumulate),
            DType::Q8_0 => dot_q8_0(group, blocks, a, out, accumulate),
            _ => out.into_iter().for_each(|o| *o = [f32::NAN; GROUP_ROWS]),
        }
    }
}

/// Stores the sixteen sums `acc` in `o`, or adds them to it (`o + acc`,
/// the residual add as the scalar twin rounds it).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store(o: &mut [f32; GROUP_ROWS], acc: __m512, accumulate: bool) {
    // SAFETY: `o` is sixteen f32.
    unsafe {
        let acc = if accumulate {
            _mm512_add_ps(_mm512_loadu_ps(o.as_ptr()), acc)
        } else {
            acc
        };
        _mm512_storeu_ps(o.as_mut_ptr(), acc);
    }
}

/// Runs `$body` with `$t` bound to each literal `0..T` (`T <= 16`). The
/// copies carry constant indices, so the per-row accumulators stay in
/// registers; a `for t in 0..T` loop this large is not unrolled by LLVM
/// and spills them to the stack on every block.
macro_rules! for_each_row {
    ($T:ident, $t:ident, $body:block) => {
        for_each_row!(@ $T, $t, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $T:ident, $t:ident, $body:block, $($n:literal)*) => {
        const { assert!($T <= 16, "group kernels take at most 16 activation rows") };
        $( if $n < $T { let $t: usize = $n; $body } )*
    };
}

/// Four activation bytes (`qa[4w..4w+4]`) in every i32 lane.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn word(qa: *const i8, w: usize) -> __m512i {
    // SAFETY: the caller's `qa` points at a 32-byte block and `w < 8`.
    unsafe { _mm512_set1_epi32(qa.add(4 * w).cast::<i32>().read_unaligned()) }
}

/// The sixteen f16 values at `p`, widened.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
unsafe fn halves(p: *const u8) -> __m512 {
    // SAFETY: the caller's `p` points at 32 bytes.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

/// One block of one activation row against the group's sixteen rows:
/// `acc + (offset + Σ w·qa) · (d · da)`, `w` the block's quants as eight
/// four-element columns, `offset` the format's integer correction.
///
/// # Safety
/// `qa` points at the activation block's 32 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[inline]
unsafe fn add_block(
    acc: __m512,
    w: &[__m512i; 8],
    qa: *const i8,
    offset: __m512i,
    d: __m512,
    da: f32,
) -> __m512 {
    // Two chains halve the dependent vpdpbusd latency of one block. (One
    // chain per row, starting at the offset, saves the vpaddd; with a tile
    // of 16 rows it measured no faster, within noise, so the one body
    // serves every tile size.)
    let mut s0 = offset;
    let mut s1 = _mm512_setzero_si512();
    for c in 0..4 {
        // SAFETY: qa points at 32 bytes (the caller's contract); c + 4 < 8.
        unsafe {
            s0 = _mm512_dpbusd_epi32(s0, w[c], word(qa, c));
            s1 = _mm512_dpbusd_epi32(s1, w[c + 4], word(qa, c + 4));
        }
    }
    let isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
    let scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
    _mm512_fmadd_ps(isum, scale, acc)
}

/// Blocks ahead that [`prefetch_block`] asks for: at a tile of 16 rows a
/// block takes a few hundred cycles, so a few blocks cover a DRAM miss
/// (4 measured better than 1 or 2 at batch 16 and the same as 8).
const PREFETCH_AHEAD: usize = 4;

/// Asks for the cache lines of block `b + PREFETCH_AHEAD` of the group at
/// `g` (`len` bytes, `blocks` blocks of `qb` quant bytes; `parts` the
/// offsets of its per-block scale arrays), or, past the last block, of the
/// next group in memory (groups are contiguous). The hardware prefetchers
/// see each group as three short streams (quants, scales, mins) and stall
/// the first loads of each: in profiles of batched decode the loads at the
/// start of a block held a fifth of the kernel's samples. A prefetch past
/// the matrix's end is harmless: it never faults.
#[target_feature(enable = "avx512f")]
#[inline]
fn prefetch_block(g: *const u8, len: usize, blocks: usize, qb: usize, parts: &[usize], b: usize) {
    let (base, vb) = match b + PREFETCH_AHEAD {
        vb if vb < blocks => (g, vb),
        vb => (g.wrapping_add(len), vb - blocks),
    };
    let q = base.wrapping_add(qb * vb);
    for line in (0..qb).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(line).cast());
    }
    for &at in parts {
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + 32 * vb).cast());
    }
}

/// Four bits of each lane of `bits` (`bits & 15`) spread to bit 4 of the
/// lane's four bytes (bit `k` to byte `k`): the multiply places copies of
/// the nibble 7 bits apart, so bit `k` lands at `8k` with no carries.
#[target_feature(enable = "avx512f")]
#[inline]
fn spread_nibble(bits: __m512i) -> __m512i {
    let nibble = _mm512_and_si512(bits, _mm512_set1_epi32(0x0F));
    let spread = _mm512_mullo_epi32(nibble, _mm512_set1_epi32(0x0020_4081));
    _mm512_slli_epi32(_mm512_and_si512(spread, _mm512_set1_epi32(0x0101_0101)), 4)
}

/// Q4_1 (`HAS_MIN`), Q4_0 (offset 8 taken off the integer sum), and Q5_1
/// and Q5_0 (offset 16) with `FIVE`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_nibbles<const T: usize, const HAS_MIN: bool, const FIVE: bool>(
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let dtype = match (HAS_MIN, FIVE) {
        (true, false) => DType::Q4_1,
        (false, false) => DType::Q4_0,
        (true, true) => DType::Q5_1,
        (false, true) => DType::Q5_0,
    };
    let qb = quant_bytes(dtype);
    let offset_per_sum = -quant_offset(dtype);
    let (scales_at, mins_at) = part_offsets(dtype, blocks);
    let g = group.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    let sums: [*const i32; T] = std::array::from_fn(|t| a[t].sums.as_ptr());
    let parts = if HAS_MIN {
        &[scales_at, mins_at][..]
    } else {
        &[scales_at][..]
    };
    for b in 0..blocks {
        prefetch_block(g, group.len(), blocks, qb, parts, b);
        // SAFETY: block b's quants, scales and mins lie inside the group.
        let (w, d, m) = unsafe {
            let q = g.add(qb * b);
            let mut w = [zero; 8];
            // Each row's fifth bits (bit j: element j), one row per lane.
            let qh = if FIVE {
                _mm512_loadu_si512(q.add(256).cast())
            } else {
                zero
            };
            for c in 0..4 {
                let raw = _mm512_loadu_si512(q.add(64 * c).cast());
                // Low nibbles: elements 4c..4c+4; high: 16+4c..16+4c+4.
                w[c] = _mm512_and_si512(raw, low);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                if FIVE {
                    let shift = _mm512_set1_epi32(4 * c as i32);
                    let low_bits = _mm512_srlv_epi32(qh, shift);
                    let high_bits = _mm512_srli_epi32(low_bits, 16);
                    w[c] = _mm512_or_si512(w[c], spread_nibble(low_bits));
                    w[c + 4] = _mm512_or_si512(w[c + 4], spread_nibble(high_bits));
                }
            }
            let d = halves(g.add(scales_at + 32 * b));
            let m = if HAS_MIN {
                halves(g.add(mins_at + 32 * b))
            } else {
                _mm512_setzero_ps()
            };
            (w, d, m)
        };
        for_each_row!(T, t, {
            // SAFETY: every activation row holds `blocks` blocks (checked
            // by the caller), so block b's bytes, scales and sum exist.
            let (qa, da, sa, sum) = unsafe {
                (
                    qs[t].add(QK * b),
                    *ds[t].add(2 * b),
                    *ds[t].add(2 * b + 1),
                    *sums[t].add(b),
                )
            };
            let offset = if HAS_MIN {
                zero
            } else {
                _mm512_set1_epi32(offset_per_sum * sum)
            };
            // SAFETY: qa points at block b's 32 bytes.
            acc[t] = unsafe { add_block(acc[t], &w, qa, offset, d, da) };
            if HAS_MIN {
                acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sa), acc[t]);
            }
        });
    }
    for (o, acc) in out.into_iter().zip(acc) {
        // SAFETY: `o` is sixteen f32.
        unsafe { store(o, acc, accumulate) };
    }
}

/// Q8_0: quants stored as `q + 128`; `128 · Σq_a` is taken off exactly.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_q8_0<const T: usize>(
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let (scales_at, _) = part_offsets(DType::Q8_0, blocks);
    let g = group.as_ptr();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    let sums: [*const i32; T] = std::array::from_fn(|t| a[t].sums.as_ptr());
    for b in 0..blocks {
        prefetch_block(g, group.len(), blocks, 512, &[scales_at], b);
        // SAFETY: block b's quants and scales lie inside the group.
        let (w, d) = unsafe {
            let q = g.add(512 * b);
            // A loop rather than `array::from_fn`: keep the loads in this
            // function's target features.
            let mut w = [zero; 8];
            for (i, w) in w.iter_mut().enumerate() {
                *w = _mm512_loadu_si512(q.add(64 * i).cast());
            }
            (w, halves(g.add(scales_at + 32 * b)))
        };
        for_each_row!(T, t, {
            // SAFETY: as in `dot_q4`.
            let (qa, da, sum) = unsafe { (qs[t].add(QK * b), *ds[t].add(2 * b), *sums[t].add(b)) };
            let offset = _mm512_set1_epi32(-128 * sum);
            // SAFETY: qa points at block b's 32 bytes.
            acc[t] = unsafe { add_block(acc[t], &w, qa, offset, d, da) };
        });
    }
    for (o, acc) in out.into_iter().zip(acc) {
        // SAFETY: `o` is sixteen f32.
        unsafe { store(o, acc, accumulate) };
    }
}
