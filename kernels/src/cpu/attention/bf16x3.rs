//! f32-accurate products on AMX's BF16 tiles (`--attention-precision
//! bf16x3`): each operand `x` of a prompt row's two products is split in
//! a BF16 high part and a BF16 low part, `hi = bf16(x)`, `lo = bf16(x −
//! hi)`, and a product is `hi·hi + hi·lo + lo·hi`, three `tdpbf16ps` sums
//! into the same f32 accumulator. `lo·lo` is left out: it is below
//! 2⁻¹⁶ of the product, under the rounding of `lo` itself.
//!
//! How exact: `x − hi` is exact in f32, so `hi + lo` is `x` to BF16's
//! rounding of `lo`, a relative error of at most 2⁻¹⁷ (to 2⁻¹⁸ typically):
//! an F16 key or value (11-bit significand) splits exactly, an f32 query
//! or probability to about 16 bits; a product's terms are exact in f32
//! and summed in f32 (in the tile's own order, as for `bf16`). So a score
//! or an output carries about 2⁻¹⁶ of the sum of its terms' magnitudes
//! where f32's chains carry about 2⁻²⁴ · √length, and BF16 2⁻⁸.
//!
//! The three products are one product of vectors three times as long:
//! a query (or a row of probabilities) packs as `[hi | hi | lo]` and a key
//! (or a block of values) as `[hi | lo | hi]`, so the span fold's AMX
//! kernels (`blocked_amx::span_scores`, `span_weighted`) run unchanged on
//! three times the pairs. Everything else (spans at fixed positions,
//! padding, the softmax in f32) is `blocked_span`'s, so a prompt row's
//! result still depends only on its query, its position and the cache.

use super::bf16::{self, Bf16Isa};
use crate::cpu::kv_layout::KEY_BLOCK;

/// Operand parts of a split product: `[hi | hi | lo]` against
/// `[hi | lo | hi]`.
pub(super) const TERMS: usize = 3;

/// How many times its plain length an operand packs to under `b`.
pub(super) fn terms(b: Bf16Isa) -> usize {
    if b.split() {
        TERMS
    } else {
        1
    }
}

/// `x` as `hi + lo`: `hi` is `x` rounded to BF16 (`bf16::round`), `lo`
/// the rest, exact in f32 (the packers round it to BF16). A non-finite
/// `hi` keeps all of `x`.
#[inline]
pub(super) fn hi_lo(x: f32) -> (f32, f32) {
    let hi = bf16::widen(bf16::round(x));
    if hi.is_finite() {
        (hi, x - hi)
    } else {
        (hi, 0.0)
    }
}

/// Where each part goes in a packed operand of three sections.
#[derive(Clone, Copy)]
pub(super) enum Side {
    /// Queries and probabilities: `[hi | hi | lo]`.
    Left,
    /// Keys and values: `[hi | lo | hi]`.
    Right,
}

/// Fills `dst`'s three equal sections from its `hi` and `lo` parts:
/// `split(hi, lo)` writes them into the sections `side` names, the
/// second copy of `hi` is copied after.
fn place(side: Side, dst: &mut [u32], split: impl FnOnce(&mut [u32], &mut [u32])) {
    let len = dst.len() / TERMS;
    let (first, rest) = dst.split_at_mut(len);
    let (second, third) = rest.split_at_mut(len);
    match side {
        Side::Left => {
            split(first, &mut third[..len]);
            second.copy_from_slice(first);
        }
        Side::Right => {
            split(first, second);
            third[..len].copy_from_slice(first);
        }
    }
}

/// A query of `src` (an even length) as `bf16::pack_in_order` pairs,
/// split in three sections (`dst.len() == TERMS · src.len() / 2`).
pub(super) fn pack_query(b: Bf16Isa, src: &[f32], dst: &mut [u32]) {
    place(Side::Left, dst, |hi, lo| split_in_order(b, src, hi, lo));
}

/// A row of probabilities over whole key blocks, each block's sixteen
/// pairs split in three sections of its own (`dst.len() == TERMS ·
/// src.len() / 2`), in the order [`pack_rows`] lays out each block's
/// values.
pub(super) fn pack_probabilities(b: Bf16Isa, src: &[f32], dst: &mut [u32]) {
    let block = TERMS * KEY_BLOCK / 2;
    for (p, to) in src.chunks(KEY_BLOCK).zip(dst.chunks_exact_mut(block)) {
        place(Side::Left, to, |hi, lo| split_in_order(b, p, hi, lo));
    }
}

/// What [`pack_rows`] reads: rows of f32, or of F16 as an F16 cache
/// stores them.
#[derive(Clone, Copy)]
pub(super) enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
}

/// Rows `2m` and `2m + 1` of `src` (rows of `row`, an even count) as
/// `bf16::pack` pairs, pair row `m`, in three sections of
/// `src.len() / 2` pairs (`[hi | lo | hi]`): a key tile (`row` of
/// sixteen keys, one a dimension) or a block's values (`row` of
/// `head_dim`).
pub(super) fn pack_rows(b: Bf16Isa, src: Rows<'_>, row: usize, dst: &mut [u32]) {
    place(Side::Right, dst, |hi, lo| split_rows(b, src, row, hi, lo));
}

/// `src` in order as pairs, split: pair `i`'s high parts to `hi[i]`,
/// its low parts to `lo[i]`; past `src`, 0.
fn split_in_order(b: Bf16Isa, src: &[f32], hi: &mut [u32], lo: &mut [u32]) {
    let n = hi.len().min(lo.len());
    let done = match b.simd() {
        // SAFETY: `simd` is set only where AVX-512 BF16 (with F and BW)
        // was detected; the kernel stays inside the three slices.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { x86::split_in_order(src, &mut hi[..n], &mut lo[..n]) },
        _ => 0,
    };
    let part = |i: usize| src.get(i).map_or((0.0, 0.0), |x| hi_lo(*x));
    for i in done..n {
        let ((h0, l0), (h1, l1)) = (part(2 * i), part(2 * i + 1));
        hi[i] = pair(h0, h1);
        lo[i] = pair(l0, l1);
    }
}

/// Pair rows of `src` (see [`pack_rows`]), split.
fn split_rows(b: Bf16Isa, src: Rows<'_>, row: usize, hi: &mut [u32], lo: &mut [u32]) {
    let done = match (b.simd(), src) {
        // SAFETY: as in `split_in_order`; the kernels read and write
        // whole pair rows inside the slices.
        #[cfg(target_arch = "x86_64")]
        (true, Rows::F32(s)) => unsafe { x86::split_rows(s, row, hi, lo) },
        #[cfg(target_arch = "x86_64")]
        (true, Rows::F16(s)) => unsafe { x86::split_rows_f16(s, row, hi, lo) },
        _ => 0,
    };
    let at = |i: usize| match src {
        Rows::F32(s) => s.get(i).copied(),
        Rows::F16(s) => s.get(i).map(|x| x.to_f32()),
    };
    let part = |i: usize| at(i).map_or((0.0, 0.0), hi_lo);
    let pairs = hi.len().min(lo.len());
    for k in done..pairs {
        let (m, i) = (k / row.max(1), k % row.max(1));
        let ((h0, l0), (h1, l1)) = (part(2 * m * row + i), part((2 * m + 1) * row + i));
        hi[k] = pair(h0, h1);
        lo[k] = pair(l0, l1);
    }
}

/// Two f32 as one BF16 pair (`bf16::round` each).
fn pair(even: f32, odd: f32) -> u32 {
    u32::from(bf16::round(even)) | u32::from(bf16::round(odd)) << 16
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers have AVX-512 F, BW and BF16.
    use std::arch::x86_64::*;

    /// Sixteen elements of `e` then sixteen of `o` rounded to BF16 words
    /// (as `bf16::round`), and the words of their remainders `x − hi`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn split(e: __m512, o: __m512) -> (__m512i, __m512i) {
        // SAFETY: both are 64 bytes of plain lanes.
        let words = |x: __m512bh| unsafe { std::mem::transmute::<__m512bh, __m512i>(x) };
        let h = words(_mm512_cvtne2ps_pbh(o, e));
        let widen =
            |w: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(w)));
        let e_hi = widen(_mm512_castsi512_si256(h));
        let o_hi = widen(_mm512_extracti64x4_epi64::<1>(h));
        let l = words(_mm512_cvtne2ps_pbh(
            _mm512_sub_ps(o, o_hi),
            _mm512_sub_ps(e, e_hi),
        ));
        (h, l)
    }

    /// `super::split_in_order` on whole vectors of 32 elements; returns
    /// how many pairs it did.
    ///
    /// # Safety
    /// See the module.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn split_in_order(src: &[f32], hi: &mut [u32], lo: &mut [u32]) -> usize {
        let whole = (src.len() / 32).min(hi.len() / 16).min(lo.len() / 16);
        for i in 0..whole {
            // SAFETY: 32 elements from 32·i of `src`, 16 pairs from 16·i of
            // `hi` and `lo` (`whole` bounds them).
            unsafe {
                let e = _mm512_loadu_ps(src.as_ptr().add(32 * i));
                let o = _mm512_loadu_ps(src.as_ptr().add(32 * i + 16));
                let (h, l) = split(e, o);
                _mm512_storeu_si512(hi.as_mut_ptr().add(16 * i).cast(), h);
                _mm512_storeu_si512(lo.as_mut_ptr().add(16 * i).cast(), l);
            }
        }
        16 * whole
    }

    /// Word `2j` of a pair row is word `j` (the even row's), word `2j + 1`
    /// word `16 + j` (the odd row's).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn interleave() -> __m512i {
        let order: [i16; 32] = std::array::from_fn(|w| ((w % 2) * 16 + w / 2) as i16);
        // SAFETY: 64 bytes from a 64-byte array.
        unsafe { _mm512_loadu_si512(order.as_ptr().cast()) }
    }

    /// `super::split_rows` of f32 rows (`row` a multiple of 16) on whole
    /// pair rows; returns how many pairs it did.
    ///
    /// # Safety
    /// See the module.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn split_rows(
        src: &[f32],
        row: usize,
        hi: &mut [u32],
        lo: &mut [u32],
    ) -> usize {
        let load = |i: usize| {
            // SAFETY: `rows` below keeps element i + 16 inside `src`.
            unsafe { _mm512_loadu_ps(src.as_ptr().add(i)) }
        };
        // SAFETY: as above.
        unsafe { rows(src.len(), row, hi, lo, load) }
    }

    /// `super::split_rows` of F16 rows (widened exactly by `vcvtph2ps`).
    ///
    /// # Safety
    /// See the module.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn split_rows_f16(
        src: &[half::f16],
        row: usize,
        hi: &mut [u32],
        lo: &mut [u32],
    ) -> usize {
        let s = src.as_ptr().cast::<u16>();
        let load = |i: usize| {
            // SAFETY: `rows` below keeps element i + 16 inside `src`.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.add(i).cast())) }
        };
        // SAFETY: as above.
        unsafe { rows(src.len(), row, hi, lo, load) }
    }

    /// The pair rows of `len` elements in rows of `row` (a multiple of
    /// 16; `load(i)` gives elements `i..i + 16`) split into `hi` and `lo`;
    /// returns the pairs done (whole pair rows that fit all three).
    ///
    /// # Safety
    /// See the module; `load` reads inside its source for `i + 16 <= len`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn rows(
        len: usize,
        row: usize,
        hi: &mut [u32],
        lo: &mut [u32],
        load: impl Fn(usize) -> __m512,
    ) -> usize {
        if row == 0 || !row.is_multiple_of(16) {
            return 0;
        }
        let order = interleave();
        let pair_rows = (len / (2 * row)).min(hi.len() / row).min(lo.len() / row);
        for m in 0..pair_rows {
            for i in (0..row).step_by(16) {
                let (h, l) = split(load(2 * m * row + i), load((2 * m + 1) * row + i));
                // SAFETY: pairs m·row + i .. + 16 are inside `hi` and `lo`.
                unsafe {
                    let at = m * row + i;
                    let h = _mm512_permutexvar_epi16(order, h);
                    let l = _mm512_permutexvar_epi16(order, l);
                    _mm512_storeu_si512(hi.as_mut_ptr().add(at).cast(), h);
                    _mm512_storeu_si512(lo.as_mut_ptr().add(at).cast(), l);
                }
            }
        }
        pair_rows * row
    }
}
