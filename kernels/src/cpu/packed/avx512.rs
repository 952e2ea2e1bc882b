//! The group kernels on AVX-512 VNNI: one `vpdpbusd` adds four products
//! to each of sixteen row sums. See the module documentation for the
//! layout and the contract `scalar` spells out.
//!
//! # Safety
//! Every function needs AVX-512 F/BW/VNNI and F16C, a `group` in the
//! layout of `blocks` blocks, and activation rows of `blocks` blocks.

use std::arch::x86_64::*;

use super::layout::{quant_offset, Layout, GROUP_ROWS};
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::IQ4_VALUES;
use crate::formats::blocks::QK;
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
            // `HIGH16` for the Q4 types (see `nibble_block`).
            DType::Q4_1 => {
                dot_nibbles::<T, true, false, false, true>(group, blocks, a, out, accumulate)
            }
            DType::Q4_0 => {
                dot_nibbles::<T, false, false, false, true>(group, blocks, a, out, accumulate)
            }
            DType::Q5_1 => {
                dot_nibbles::<T, true, true, false, false>(group, blocks, a, out, accumulate)
            }
            DType::Q5_0 => {
                dot_nibbles::<T, false, true, false, false>(group, blocks, a, out, accumulate)
            }
            DType::IQ4NL => {
                dot_nibbles::<T, false, false, true, false>(group, blocks, a, out, accumulate)
            }
            DType::Q8_0 => dot_q8_0(group, blocks, a, out, accumulate),
            _ => out.into_iter().for_each(|o| *o = [f32::NAN; GROUP_ROWS]),
        }
    }
}

/// Stores the sixteen sums `acc` in `o`, or adds them to it (`o + acc`,
/// the residual add as the scalar twin rounds it).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store(o: &mut [f32; GROUP_ROWS], acc: __m512, accumulate: bool) {
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

/// Four activation bytes (`qa[4w..4w+4]`) in every i32 lane.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn word(qa: *const i8, w: usize) -> __m512i {
    // SAFETY: the caller's `qa` points at a 32-byte block and `w < 8`.
    unsafe { _mm512_set1_epi32(qa.add(4 * w).cast::<i32>().read_unaligned()) }
}

/// The sixteen f16 values at `p`, widened.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
pub(super) unsafe fn halves(p: *const u8) -> __m512 {
    // SAFETY: the caller's `p` points at 32 bytes.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

/// One block of one activation row against the group's sixteen rows:
/// `acc + (offset + Σ w·qa) · (d · da)`, `w` the block's quants as eight
/// four-element columns, `offset` the format's integer correction. Words
/// `0..4` may hold their quants times `2^SHIFT0` and words `4..8` times
/// `2^SHIFT1` (a high nibble masked in place, `q · 16`, rather than
/// shifted down: one op a word fewer); their sums are shifted back, exactly,
/// as every term is a multiple.
///
/// # Safety
/// `qa` points at the activation block's 32 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[inline]
pub(super) unsafe fn add_block<const SHIFT0: u32, const SHIFT1: u32>(
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
    // serves every tile size.) The offset is in `s0`, which callers with
    // an offset leave unscaled.
    let mut s0 = offset;
    let mut s1 = _mm512_setzero_si512();
    for c in 0..4 {
        // SAFETY: qa points at 32 bytes (the caller's contract); c + 4 < 8.
        unsafe {
            s0 = _mm512_dpbusd_epi32(s0, w[c], word(qa, c));
            s1 = _mm512_dpbusd_epi32(s1, w[c + 4], word(qa, c + 4));
        }
    }
    let sum = if SHIFT0 == SHIFT1 {
        _mm512_srai_epi32::<SHIFT0>(_mm512_add_epi32(s0, s1))
    } else {
        _mm512_add_epi32(
            _mm512_srai_epi32::<SHIFT0>(s0),
            _mm512_srai_epi32::<SHIFT1>(s1),
        )
    };
    let isum = _mm512_cvtepi32_ps(sum);
    let scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
    _mm512_fmadd_ps(isum, scale, acc)
}

/// Bytes ahead of the block being read that [`prefetch_unit`] asks for
/// at a tile of several activation rows: a few blocks (at a tile of 16 a
/// block takes a few hundred cycles; 4 blocks ahead measured better than
/// 1 or 2 there).
const PREFETCH_AHEAD: usize = 2048;

/// The same at one activation row (single-stream decode), where a block
/// takes a few dozen cycles and 2 KB ahead left the kernel waiting on
/// DRAM. Steps of 8 alternated in one decode (two threads, depth 0 to
/// ~1k, medians of 8-step rates): Gemma 3 135 -> 152 and 145 -> 169
/// tok/s against 2 KB, SmolLM2 266 -> 293 (+0-4%, never slower, on a
/// slower host later); 4 KB and 16 KB between, 32 KB no gain, prefetching
/// to L2 (`T1`) the same as to L1, none at all 30% slower
/// (docs/bench/roofline.md).
const PREFETCH_AHEAD_ONE_ROW: usize = 8192;

/// At the first block of each unit, asks for the cache lines of the unit
/// [`PREFETCH_AHEAD`] ([`PREFETCH_AHEAD_ONE_ROW`] at one activation row)
/// bytes on in the group stream (or the next group in
/// memory: groups are contiguous and a prefetch past the matrix's end
/// never faults). The hardware prefetchers alone stalled the first loads
/// of a block: in profiles of batched decode those loads held a fifth of
/// the kernel's samples.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn prefetch_unit<const T: usize>(g: *const u8, layout: &Layout, b: usize) {
    if !b.is_multiple_of(layout.per_unit) {
        return;
    }
    let bytes = if T == 1 {
        PREFETCH_AHEAD_ONE_ROW
    } else {
        PREFETCH_AHEAD
    };
    let ahead = bytes.div_ceil(layout.unit_bytes) * layout.unit_bytes;
    let unit = g.wrapping_add((b / layout.per_unit) * layout.unit_bytes + ahead);
    for line in (0..layout.unit_bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(unit.wrapping_add(line).cast());
    }
}

/// [`IQ4_VALUES`] plus 128, for `vpdpbusd`'s unsigned operand.
const IQ4_UNSIGNED: [u8; 16] = {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (IQ4_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    out
};

/// Block `b` of a group of a 32-element nibble type (see [`dot_nibbles`]
/// for the const parameters): its quants as eight words of sixteen rows,
/// word `i` holding elements `4i..4i+4` (`vpdpbusd`'s unsigned operand,
/// the format's offset still in), its `d`, and its `m` (zero without).
/// With `HIGH16` (not with `FIVE` or `TABLE`, whose high quants need
/// their low bits) words `4..8` hold `16 · q`, the high nibbles masked in
/// place (`add_block` with `SHIFT1` 4 takes them).
///
/// # Safety
/// Block `b` lies inside the group at `g` in `layout`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibble_block<
    const HAS_MIN: bool,
    const FIVE: bool,
    const TABLE: bool,
    const HIGH16: bool,
>(
    g: *const u8,
    layout: &Layout,
    b: usize,
) -> ([__m512i; 8], __m512, __m512) {
    // IQ4_NL's table, unsigned (`+ 128`), in every 128-bit lane.
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_UNSIGNED.as_ptr().cast()));
    let low = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let (q_at, p_at) = layout.block(b);
    // SAFETY: block b's quants, scales and mins lie inside the group.
    unsafe {
        let q = g.add(q_at);
        let mut w = [zero; 8];
        // Byte 4r + e, bit c: row r's element 4c + e's fifth bit.
        let qh = if FIVE {
            _mm512_loadu_si512(q.add(256).cast())
        } else {
            zero
        };
        let bit4 = _mm512_set1_epi8(0x10);
        for c in 0..4 {
            let raw = _mm512_loadu_si512(q.add(64 * c).cast());
            // Low nibbles: elements 4c..4c+4; high: 16+4c..16+4c+4.
            w[c] = _mm512_and_si512(raw, low);
            w[c + 4] = if HIGH16 {
                _mm512_andnot_si512(low, raw)
            } else {
                _mm512_and_si512(_mm512_srli_epi16(raw, 4), low)
            };
            if TABLE {
                w[c] = _mm512_shuffle_epi8(table, w[c]);
                w[c + 4] = _mm512_shuffle_epi8(table, w[c + 4]);
            }
            if FIVE {
                // Bit c to bit 4, and bit c + 4 to bit 4: the 16-bit
                // shifts move no wanted bit across a byte (4 - c and c
                // are at most 4 and 3).
                let low_bits = _mm512_sllv_epi16(qh, _mm512_set1_epi16(4 - c as i16));
                let high_bits = _mm512_srlv_epi16(qh, _mm512_set1_epi16(c as i16));
                w[c] = _mm512_or_si512(w[c], _mm512_and_si512(low_bits, bit4));
                w[c + 4] = _mm512_or_si512(w[c + 4], _mm512_and_si512(high_bits, bit4));
            }
        }
        let d = halves(g.add(p_at));
        let m = if HAS_MIN {
            halves(g.add(p_at + 32))
        } else {
            _mm512_setzero_ps()
        };
        (w, d, m)
    }
}

/// Block `b` of a Q8_0 group: its eight words (`q + 128`) and its `d`.
///
/// # Safety
/// Block `b` lies inside the group at `g` in `layout`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q8_block(g: *const u8, layout: &Layout, b: usize) -> ([__m512i; 8], __m512) {
    let (q_at, p_at) = layout.block(b);
    // SAFETY: block b's quants and scales lie inside the group.
    unsafe {
        let q = g.add(q_at);
        // A loop rather than `array::from_fn`: keep the loads in this
        // function's target features.
        let mut w = [_mm512_setzero_si512(); 8];
        for (i, w) in w.iter_mut().enumerate() {
            *w = _mm512_loadu_si512(q.add(64 * i).cast());
        }
        (w, halves(g.add(p_at)))
    }
}

/// Q4_1 (`HAS_MIN`), Q4_0 (offset 8 taken off the integer sum), Q5_1
/// and Q5_0 (offset 16) with `FIVE`, and IQ4_NL (`TABLE`: each nibble
/// looked up as `T[q] + 128`, offset 128).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_nibbles<
    const T: usize,
    const HAS_MIN: bool,
    const FIVE: bool,
    const TABLE: bool,
    const HIGH16: bool,
>(
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let dtype = match (HAS_MIN, FIVE) {
        _ if TABLE => DType::IQ4NL,
        (true, false) => DType::Q4_1,
        (false, false) => DType::Q4_0,
        (true, true) => DType::Q5_1,
        (false, true) => DType::Q5_0,
    };
    // High nibbles masked in place where no table or fifth bit needs them
    // low.
    const { assert!(!(HIGH16 && (FIVE || TABLE))) };
    let layout = Layout::of(dtype);
    let offset_per_sum = -quant_offset(dtype);
    let g = group.as_ptr();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    let sums: [*const i32; T] = std::array::from_fn(|t| a[t].sums.as_ptr());
    for b in 0..blocks {
        prefetch_unit::<T>(g, &layout, b);
        // SAFETY: block b lies inside the group (the caller's contract).
        let (w, d, m) = unsafe { nibble_block::<HAS_MIN, FIVE, TABLE, HIGH16>(g, &layout, b) };
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
            acc[t] = unsafe {
                if HIGH16 {
                    add_block::<0, 4>(acc[t], &w, qa, offset, d, da)
                } else {
                    add_block::<0, 0>(acc[t], &w, qa, offset, d, da)
                }
            };
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
    let layout = Layout::of(DType::Q8_0);
    let g = group.as_ptr();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    let sums: [*const i32; T] = std::array::from_fn(|t| a[t].sums.as_ptr());
    for b in 0..blocks {
        prefetch_unit::<T>(g, &layout, b);
        // SAFETY: block b lies inside the group (the caller's contract).
        let (w, d) = unsafe { q8_block(g, &layout, b) };
        for_each_row!(T, t, {
            // SAFETY: as in `dot_q4`.
            let (qa, da, sum) = unsafe { (qs[t].add(QK * b), *ds[t].add(2 * b), *sums[t].add(b)) };
            let offset = _mm512_set1_epi32(-128 * sum);
            // SAFETY: qa points at block b's 32 bytes.
            acc[t] = unsafe { add_block::<0, 0>(acc[t], &w, qa, offset, d, da) };
        });
    }
    for (o, acc) in out.into_iter().zip(acc) {
        // SAFETY: `o` is sixteen f32.
        unsafe { store(o, acc, accumulate) };
    }
}
