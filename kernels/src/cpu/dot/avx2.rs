//! AVX2 (+FMA, F16C) dot products, one 32-element block per step.
//!
//! Integer products use `vpmaddubsw` (u8 × i8 → i16 pairs) then `vpmaddwd`
//! by ones (→ i32). `vpmaddubsw` saturates pair sums above 32767, so the
//! unsigned operand stays ≤ 128 everywhere: nibbles (≤ 15), Q6_K quants
//! (≤ 63) and `|w|` for Q8_0 (≤ 128) against activations in -127..=127.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C, and takes the shape
//! preconditions checked by `dot::dot_quantized`/`dot::dot_float`: `w` is
//! one row of `k` elements and each activation row has `k` elements.

use std::arch::x86_64::*;

use super::avx2_lanes::{act_block, act_ds, f16_one, f16_pair, hsum, mul_sum_u8_i8};
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::{
    q4k_block_scales, NibbleBlock, Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH, Q6K_SCALES, Q8_0_QS, QK, QK_K,
};
use crate::DType;

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_quantized<const R: usize>(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    a: &[QRow<'_>; R],
    out: &mut [f32],
) {
    let rows = w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0);
    match dtype {
        DType::Q8_0 => {
            for (w, o) in rows {
                dot_q8_0(w, a, o);
            }
        }
        DType::Q4_0 => {
            for (w, o) in rows {
                dot_nibbles::<R, false, false>(w, a, o);
            }
        }
        DType::Q4_1 => {
            for (w, o) in rows {
                dot_nibbles::<R, true, false>(w, a, o);
            }
        }
        DType::Q5_0 => {
            for (w, o) in rows {
                dot_nibbles::<R, false, true>(w, a, o);
            }
        }
        DType::Q5_1 => {
            for (w, o) in rows {
                dot_nibbles::<R, true, true>(w, a, o);
            }
        }
        DType::Q4K => {
            for (w, o) in rows {
                dot_q4k(w, a, o);
            }
        }
        DType::Q6K => {
            for (w, o) in rows {
                dot_q6k(w, a, o);
            }
        }
        DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4NL | DType::IQ4XS => {
            super::avx2_low_bit::dot_quantized(dtype, w, row_bytes, a, out)
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            for (_, o) in rows {
                *o = [f32::NAN; R];
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q8_0<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let blocks = w.len() / DType::Q8_0.block_bytes();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let block = w.as_ptr().add(b * DType::Q8_0.block_bytes());
        let d = f16_one(block);
        let q = _mm256_loadu_si256(block.add(Q8_0_QS).cast());
        let abs_q = _mm256_sign_epi8(q, q);
        for r in 0..R {
            // |w| · (a with w's sign) = w · a, with an unsigned left operand.
            let signed_a = _mm256_sign_epi8(act_block(&a[r], b), q);
            let dot = _mm256_cvtepi32_ps(mul_sum_u8_i8(abs_q, signed_a));
            let scale = _mm_mul_ss(d, act_ds(&a[r], b));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scale), dot, acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

/// The 32 bits at `p` as 32 bytes, `0x10` where the bit is set (byte `j`
/// for bit `j`): Q5_0/Q5_1's fifth bits in place.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
    // Byte j takes source byte j / 8, then every bit but bit j % 8 is set.
    let spread = _mm256_shuffle_epi8(
        bits,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Q4_0, Q4_1, Q5_0 (`FIVE`) and Q5_1 as `q·d + m` (`HAS_MIN == false`:
/// `m = -offset·d`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_nibbles<const R: usize, const HAS_MIN: bool, const FIVE: bool>(
    w: &[u8],
    a: &[QRow<'_>; R],
    out: &mut [f32; R],
) {
    let layout = const { NibbleBlock::of(HAS_MIN, FIVE) };
    let blocks = w.len() / layout.bytes;
    let low = _mm256_set1_epi8(0x0F);
    let minus_offset = _mm_setr_ps(1.0, -layout.offset, 0.0, 0.0);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut min_acc = [_mm_setzero_ps(); R];
    for b in 0..blocks {
        let block = w.as_ptr().add(b * layout.bytes);
        // [d, m, 0, 0]
        let dm = if HAS_MIN {
            f16_pair(block)
        } else {
            let d = f16_one(block);
            _mm_mul_ps(_mm_moveldup_ps(d), minus_offset)
        };
        let raw = _mm_loadu_si128(block.add(layout.qs).cast());
        let mut q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        if let Some(qh) = layout.qh {
            q = _mm256_or_si256(q, fifth_bits(block.add(qh)));
        }
        for r in 0..R {
            let dot = _mm256_cvtepi32_ps(mul_sum_u8_i8(q, act_block(&a[r], b)));
            // [d·d_a, m·s, 0, 0]
            let scales = _mm_mul_ps(dm, act_ds(&a[r], b));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), dot, acc[r]);
            min_acc[r] = _mm_add_ps(min_acc[r], scales);
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(min_acc[r]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q4k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let block_bytes = DType::Q4K.block_bytes();
    let blocks = w.len() / block_bytes;
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut min_sum = [0.0f32; R];
    for i in 0..blocks {
        let block = &w[i * block_bytes..(i + 1) * block_bytes];
        let dd = f16_pair(block.as_ptr());
        let d = _mm_cvtss_f32(dd);
        let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        let (scale, min) = q4k_block_scales(d, dmin, &block[Q4K_SCALES..Q4K_SCALES + 12]);
        for j in 0..4 {
            let raw = _mm256_loadu_si256(block.as_ptr().add(Q4K_QS + 32 * j).cast());
            let lo = _mm256_and_si256(raw, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            for r in 0..R {
                for (sub, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                    let b = i * 8 + sub;
                    let dot = _mm256_cvtepi32_ps(mul_sum_u8_i8(q, act_block(&a[r], b)));
                    let da = a[r].ds[2 * b];
                    let s = a[r].ds[2 * b + 1];
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

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q6k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
    let block_bytes = DType::Q6K.block_bytes();
    let blocks = w.len() / block_bytes;
    let low = _mm256_set1_epi8(0x0F);
    let two_bits = _mm256_set1_epi8(0x03);
    let thirty_two = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..blocks {
        let block = w.as_ptr().add(i * block_bytes);
        let d = _mm_cvtss_f32(f16_one(block.add(Q6K_D)));
        let scales = std::slice::from_raw_parts(block.add(Q6K_SCALES).cast::<i8>(), 16);
        for half in 0..2 {
            let ql0 = _mm256_loadu_si256(block.add(64 * half).cast());
            let ql1 = _mm256_loadu_si256(block.add(64 * half + 32).cast());
            let qh = _mm256_loadu_si256(block.add(Q6K_QH + 32 * half).cast());
            let quarters = [
                _mm256_or_si256(_mm256_and_si256(ql0, low), q6_high(qh, two_bits)),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low),
                    q6_high(_mm256_srli_epi16(qh, 2), two_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                    q6_high(_mm256_srli_epi16(qh, 4), two_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                    q6_high(_mm256_srli_epi16(qh, 6), two_bits),
                ),
            ];
            for (quarter, q) in quarters.into_iter().enumerate() {
                let sub = 4 * half + quarter;
                let sc = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(scales[2 * sub + 1])),
                    _mm_set1_epi16(i16::from(scales[2 * sub])),
                );
                let b = i * 8 + sub;
                for r in 0..R {
                    let act = act_block(&a[r], b);
                    // (q - 32)·a per pair of elements, exact in i16.
                    let pairs = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q, act),
                        _mm256_maddubs_epi16(thirty_two, act),
                    );
                    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, sc));
                    let scale = _mm256_set1_ps(d * a[r].ds[2 * b]);
                    acc[r] = _mm256_fmadd_ps(scale, dot, acc[r]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

/// The 2-bit fields sit at bits 0, 2, 4, 6 of qh; the caller shifts them
/// down in 16-bit lanes, which pulls bits of the next byte into the top of
/// each byte; the `& 3` drops those before moving the field to bits 4-5.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q6_high(bits: __m256i, two_bits: __m256i) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(bits, two_bits), 4)
}

/// How a float weight type is stored.
#[derive(Clone, Copy)]
enum FloatKind {
    F32,
    F16,
    Bf16,
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_float<const R: usize>(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    x: &[&[f32]; R],
    out: &mut [f32],
) {
    for (w, o) in w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0) {
        dot_float_row(dtype, w, x, o);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_float_row<const R: usize>(
    dtype: DType,
    w: &[u8],
    x: &[&[f32]; R],
    out: &mut [f32; R],
) {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::Bf16,
        _ => FloatKind::F32,
    };
    let k = x.first().map_or(0, |x| x.len());
    let mut acc = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 8 <= k {
        let weights = match kind {
            FloatKind::F32 => _mm256_loadu_ps(w.as_ptr().add(4 * i).cast()),
            FloatKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(2 * i).cast())),
            FloatKind::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(w.as_ptr().add(2 * i).cast())),
                16,
            )),
        };
        for r in 0..R {
            acc[r] = _mm256_fmadd_ps(weights, _mm256_loadu_ps(x[r].as_ptr().add(i)), acc[r]);
        }
        i += 8;
    }
    for r in 0..R {
        let mut sum = hsum(acc[r]);
        for (j, x) in x[r].iter().enumerate().skip(i) {
            let weight = match kind {
                FloatKind::F32 => crate::formats::blocks::f32_at(w, 4 * j),
                FloatKind::F16 => crate::formats::blocks::f16_at(w, 2 * j),
                FloatKind::Bf16 => crate::formats::blocks::bf16_at(w, 2 * j),
            };
            sum += weight * x;
        }
        out[r] = sum;
    }
}

const _: () = assert!(QK_K == 8 * QK);
