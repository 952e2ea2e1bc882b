//! AVX2 (+FMA, F16C) dot products of Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS,
//! one 32-element activation block per step. (The AVX-512 levels have
//! their own for all but IQ4_NL, in `avx512_low_bit`.)
//!
//! Integer sums follow `avx2`'s rules (`vpmaddubsw` with an unsigned
//! operand small enough not to saturate); the 16-element scales of Q2_K and
//! Q3_K, and IQ4_XS's 32-element ones, multiply the i16 pair sums in the
//! `vpmaddwd` step (exact in i32), as Q6_K's do.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C and the shape preconditions
//! checked by `dot::dot_quantized`.

use std::arch::x86_64::*;

use super::avx2_lanes::{act_block, act_ds, f16_one, f16_pair, hsum, mul_sum_u8_i8};
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::{f16_at, q4k_block_scales};
use crate::formats::blocks::{iq4xs_scale, IQ4NL_QS, IQ4XS_QS, IQ4_VALUES};
use crate::formats::blocks::{q3k_scale, Q2K_D, Q2K_DMIN, Q2K_QS, Q3K_D, Q3K_QS, Q3K_SCALES};
use crate::formats::blocks::{Q5K_QH, Q5K_QS, Q5K_SCALES};
use crate::DType;

/// `out[row · R + r] = W[row] · a[r]` for the types of this module.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_quantized<const R: usize>(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    a: &[QRow<'_>; R],
    out: &mut [f32],
) {
    let row: unsafe fn(&[u8], &[QRow<'_>; R], &mut [f32; R]) = match dtype {
        DType::Q2K => dot_q2k,
        DType::Q3K => dot_q3k,
        DType::Q5K => dot_q5k,
        DType::IQ4NL => dot_iq4nl,
        DType::IQ4XS => dot_iq4xs,
        _ => |_, _, o| *o = [f32::NAN; R],
    };
    for (w, o) in w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0) {
        row(w, a, o);
    }
}

/// `[lo ×8 i16, hi ×8 i16]`: one value per 16-element half of a block,
/// for `vpmaddwd` against the pair sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn halves_i16(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let bb = DType::Q2K.block_bytes();
    let three = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, block) in w.chunks_exact(bb).enumerate() {
        let (d, dmin) = (f16_at(block, Q2K_D), f16_at(block, Q2K_DMIN));
        for half in 0..2 {
            let mut raw = _mm256_loadu_si256(block.as_ptr().add(Q2K_QS + 32 * half).cast());
            for s in 0..4 {
                // Elements 128·half + 32s + l: bits 2s..2s+2 of byte l.
                let q = _mm256_and_si256(raw, three);
                raw = _mm256_srli_epi16(raw, 2);
                let j = 8 * half + 2 * s;
                let (lo, hi) = (block[j], block[j + 1]);
                let sc = halves_i16(i16::from(lo & 0x0F), i16::from(hi & 0x0F));
                let m = halves_i16(i16::from(lo >> 4), i16::from(hi >> 4));
                let b = 8 * i + 4 * half + s;
                for r in 0..R {
                    let act = act_block(&a[r], b);
                    let scaled = _mm256_madd_epi16(_mm256_maddubs_epi16(q, act), sc);
                    let mins = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, act), m);
                    let da = a[r].ds[2 * b];
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(scaled), acc[r]);
                    acc[r] = _mm256_fnmadd_ps(
                        _mm256_set1_ps(dmin * da),
                        _mm256_cvtepi32_ps(mins),
                        acc[r],
                    );
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q3k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let bb = DType::Q3K.block_bytes();
    let three = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let four = _mm256_set1_epi8(4);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, block) in w.chunks_exact(bb).enumerate() {
        let d = f16_at(block, Q3K_D);
        let scales = &block[Q3K_SCALES..Q3K_SCALES + 12];
        // Bit k of byte l: element 32k + l's high bit; shifted down once
        // per 32 elements (16-bit shifts; the `& 1` drops what crosses).
        let mut high = _mm256_loadu_si256(block.as_ptr().cast());
        for half in 0..2 {
            let mut raw = _mm256_loadu_si256(block.as_ptr().add(Q3K_QS + 32 * half).cast());
            for s in 0..4 {
                // q + 4 (0..8): the two low bits, plus 4 where the high bit is set.
                let low = _mm256_and_si256(raw, three);
                let q = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(high, one), 2));
                raw = _mm256_srli_epi16(raw, 2);
                high = _mm256_srli_epi16(high, 1);
                let j = 8 * half + 2 * s;
                let sc = halves_i16(
                    i16::from(q3k_scale(scales, j)),
                    i16::from(q3k_scale(scales, j + 1)),
                );
                let b = 8 * i + 4 * half + s;
                for r in 0..R {
                    let act = act_block(&a[r], b);
                    // (q + 4)·a - 4·a per pair of elements, exact in i16.
                    let pairs = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q, act),
                        _mm256_maddubs_epi16(four, act),
                    );
                    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, sc));
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].ds[2 * b]), dot, acc[r]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let bb = DType::Q5K.block_bytes();
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut min_sum = [0.0f32; R];
    for (i, block) in w.chunks_exact(bb).enumerate() {
        let dd = f16_pair(block.as_ptr());
        let d = _mm_cvtss_f32(dd);
        let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        let (scale, min) = q4k_block_scales(d, dmin, &block[Q5K_SCALES..Q5K_SCALES + 12]);
        // Bit k of byte l: element 32k + l's fifth bit (see `dot_q3k`).
        let mut high = _mm256_loadu_si256(block.as_ptr().add(Q5K_QH).cast());
        for j in 0..4 {
            let raw = _mm256_loadu_si256(block.as_ptr().add(Q5K_QS + 32 * j).cast());
            let lo = _mm256_or_si256(
                _mm256_and_si256(raw, low),
                _mm256_slli_epi16(_mm256_and_si256(high, one), 4),
            );
            high = _mm256_srli_epi16(high, 1);
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(raw, 4), low),
                _mm256_slli_epi16(_mm256_and_si256(high, one), 4),
            );
            high = _mm256_srli_epi16(high, 1);
            for r in 0..R {
                for (sub, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                    let b = i * 8 + sub;
                    let dot = _mm256_cvtepi32_ps(mul_sum_u8_i8(q, act_block(&a[r], b)));
                    let (da, s) = (a[r].ds[2 * b], a[r].ds[2 * b + 1]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale[sub] * da), dot, acc[r]);
                    min_sum[r] += min[sub] * s;
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]) + min_sum[r];
    }
}

/// The 32 IQ4 values of the 16 index bytes at `p` (ggml's nibble order).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn iq4_values(p: *const u8, table: __m256i) -> __m256i {
    let raw = _mm_loadu_si128(p.cast());
    let idx = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
        _mm256_set1_epi8(0x0F),
    );
    _mm256_shuffle_epi8(table, idx)
}

/// The IQ4 table in both 128-bit lanes, for `vpshufb`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn iq4_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr().cast()))
}

/// `Σ v·a` in eight i32 lanes, each pair sum times `scale` (i16): `|v|`
/// (≤ 127) against `a` with `v`'s sign keeps `vpmaddubsw` exact.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn signed_dot(v: __m256i, act: __m256i, scale: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(act, v));
    _mm256_madd_epi16(pairs, scale)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4nl<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let bb = DType::IQ4NL.block_bytes();
    let table = iq4_table();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, block) in w.chunks_exact(bb).enumerate() {
        let d = f16_one(block.as_ptr());
        let v = iq4_values(block.as_ptr().add(IQ4NL_QS), table);
        for r in 0..R {
            let dot = _mm256_cvtepi32_ps(signed_dot(v, act_block(&a[r], b), ones));
            let scale = _mm_mul_ss(d, act_ds(&a[r], b));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scale), dot, acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4xs<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let bb = DType::IQ4XS.block_bytes();
    let table = iq4_table();
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, block) in w.chunks_exact(bb).enumerate() {
        let d = f16_at(block, 0);
        for sub in 0..8 {
            let v = iq4_values(block.as_ptr().add(IQ4XS_QS + 16 * sub), table);
            let sc = _mm256_set1_epi16(i16::from(iq4xs_scale(block, sub)));
            let b = 8 * i + sub;
            for r in 0..R {
                let dot = _mm256_cvtepi32_ps(signed_dot(v, act_block(&a[r], b), sc));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].ds[2 * b]), dot, acc[r]);
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}
