//! The group kernels of Q4_K and Q6_K on AVX-512 VNNI: per 32-element
//! activation block, eight `vpdpbusd` against sixteen rows at once, as
//! `avx512`'s kernels; the sub-block scales of the K types come per row
//! from the block's parts. The contract is `scalar`'s.
//!
//! # Safety
//! Every function needs AVX-512 F/BW/VNNI and F16C, a `group` in the
//! layout of `blocks` blocks, and activation rows of `8 · blocks`
//! activation blocks.

use std::arch::x86_64::*;

use super::avx512::{add_block, halves, prefetch_unit, store, word};
use super::layout::{Layout, GROUP_ROWS};
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::QK;
use crate::DType;

/// Sixteen bytes at `p`, one per row, widened to i32 (zero-extended).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn row_bytes_u8(p: *const u8) -> __m512i {
    // SAFETY: the caller's `p` points at 16 bytes.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
}

/// Sixteen i8 at `p`, one per row, widened to i32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn row_bytes_i8(p: *const u8) -> __m512i {
    // SAFETY: the caller's `p` points at 16 bytes.
    unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
}

/// Block `b`'s `d` and `dmin` (Q4_K) or `d` (Q6_K, in the first).
///
/// # Safety
/// Block `b` lies inside the group at `g` in `layout`.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
pub(super) unsafe fn k_scales(g: *const u8, layout: &Layout, b: usize) -> (__m512, __m512) {
    let (_, p_at) = layout.block(b);
    // SAFETY: block b's parts lie inside the group.
    unsafe { (halves(g.add(p_at)), halves(g.add(p_at + 32))) }
}

/// Sub-block `j` of Q4_K block `b` (its `d`, `dmin` given): eight words
/// of sixteen rows (word `i` elements `4i..4i+4`, 0..16), the rows'
/// `d · sc` and `dmin · m`. With `HIGH16` an odd sub-block's words hold
/// `16 · q`, its high nibbles masked in place (`add_block::<4, 4>` takes
/// them: one op a word fewer than shifting them down).
///
/// # Safety
/// Block `b` lies inside the group at `g` in `layout`; `j < 8`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_sub<const HIGH16: bool>(
    g: *const u8,
    layout: &Layout,
    b: usize,
    j: usize,
    d: __m512,
    dmin: __m512,
) -> ([__m512i; 8], __m512, __m512) {
    let low = _mm512_set1_epi8(0x0F);
    let (q_at, p_at) = layout.block(b);
    // SAFETY: pair j/2's quants and sub-block j's scale and min bytes.
    unsafe {
        let pair = g.add(q_at + 512 * (j / 2));
        let mut w = [_mm512_setzero_si512(); 8];
        for (c, w) in w.iter_mut().enumerate() {
            let raw = _mm512_loadu_si512(pair.add(64 * c).cast());
            *w = match (j % 2 == 1, HIGH16) {
                (false, _) => _mm512_and_si512(raw, low),
                (true, true) => _mm512_andnot_si512(low, raw),
                (true, false) => _mm512_and_si512(_mm512_srli_epi16(raw, 4), low),
            };
        }
        let sc = _mm512_cvtepi32_ps(row_bytes_u8(g.add(p_at + 64 + 16 * j)));
        let m = _mm512_cvtepi32_ps(row_bytes_u8(g.add(p_at + 192 + 16 * j)));
        (w, _mm512_mul_ps(d, sc), _mm512_mul_ps(dmin, m))
    }
}

/// Sub-block `j` of Q6_K block `b`: eight words of sixteen rows (word `i`
/// elements `4i..4i+4`, unsigned `q`, 0..64) and the rows' i8 scales of
/// its two 16-element halves.
///
/// # Safety
/// Block `b` lies inside the group at `g` in `layout`; `j < 8`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k_sub(
    g: *const u8,
    layout: &Layout,
    b: usize,
    j: usize,
) -> ([__m512i; 8], __m512i, __m512i) {
    let (q_at, p_at) = layout.block(b);
    // SAFETY: block j's quants and its two scales.
    unsafe {
        let words = g.add(q_at + 512 * j);
        let mut w = [_mm512_setzero_si512(); 8];
        for (c, w) in w.iter_mut().enumerate() {
            *w = _mm512_loadu_si512(words.add(64 * c).cast());
        }
        (
            w,
            row_bytes_i8(g.add(p_at + 32 + 32 * j)),
            row_bytes_i8(g.add(p_at + 48 + 32 * j)),
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_q4k<const T: usize>(
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let layout = Layout::of(DType::Q4K);
    let g = group.as_ptr();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    for b in 0..blocks {
        prefetch_unit::<T>(g, &layout, b);
        // SAFETY: block b lies inside the group (the caller's contract).
        let (d, dmin) = unsafe { k_scales(g, &layout, b) };
        for j in 0..8 {
            // SAFETY: block b lies inside the group (the caller's contract).
            let (w, scale, min) = unsafe { q4k_sub::<true>(g, &layout, b, j, d, dmin) };
            let ab = 8 * b + j;
            for_each_row!(T, t, {
                // SAFETY: every activation row holds `8 · blocks` blocks
                // (checked by the caller).
                let (qa, da, sa) = unsafe {
                    (
                        qs[t].add(QK * ab),
                        *ds[t].add(2 * ab),
                        *ds[t].add(2 * ab + 1),
                    )
                };
                // SAFETY: qa points at block ab's 32 bytes; an odd
                // sub-block's words are `16 · q` (`q4k_sub`).
                acc[t] = unsafe {
                    if j % 2 == 1 {
                        add_block::<4, 4>(acc[t], &w, qa, zero, scale, da)
                    } else {
                        add_block::<0, 0>(acc[t], &w, qa, zero, scale, da)
                    }
                };
                acc[t] = _mm512_fnmadd_ps(min, _mm512_set1_ps(sa), acc[t]);
            });
        }
    }
    for (o, acc) in out.into_iter().zip(acc) {
        // SAFETY: `o` is sixteen f32.
        unsafe { store(o, acc, accumulate) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_q6k<const T: usize>(
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let layout = Layout::of(DType::Q6K);
    let g = group.as_ptr();
    let mut acc = [_mm512_setzero_ps(); T];
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let ds: [*const f32; T] = std::array::from_fn(|t| a[t].ds.as_ptr());
    let halves_of: [*const i32; T] = std::array::from_fn(|t| a[t].half_sums.as_ptr());
    for b in 0..blocks {
        prefetch_unit::<T>(g, &layout, b);
        // SAFETY: block b lies inside the group (the caller's contract).
        let (d, _) = unsafe { k_scales(g, &layout, b) };
        for j in 0..8 {
            // SAFETY: block b lies inside the group (the caller's contract).
            let (w, sc0, sc1) = unsafe { q6k_sub(g, &layout, b, j) };
            let ab = 8 * b + j;
            for_each_row!(T, t, {
                // SAFETY: every activation row holds `8 · blocks` blocks
                // (checked by the caller), two half sums each.
                let (qa, da, h0, h1) = unsafe {
                    (
                        qs[t].add(QK * ab),
                        *ds[t].add(2 * ab),
                        *halves_of[t].add(2 * ab),
                        *halves_of[t].add(2 * ab + 1),
                    )
                };
                let mut s0 = _mm512_set1_epi32(-32 * h0);
                let mut s1 = _mm512_set1_epi32(-32 * h1);
                for c in 0..4 {
                    // SAFETY: qa points at 32 bytes; c + 4 < 8.
                    unsafe {
                        s0 = _mm512_dpbusd_epi32(s0, w[c], word(qa, c));
                        s1 = _mm512_dpbusd_epi32(s1, w[c + 4], word(qa, c + 4));
                    }
                }
                let isum =
                    _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1));
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
            });
        }
    }
    for (o, acc) in out.into_iter().zip(acc) {
        // SAFETY: `o` is sixteen f32.
        unsafe { store(o, acc, accumulate) };
    }
}
