//! NEON (aarch64) dot products for Q8_0, Q4_0 and Q4_1 weight rows; the
//! other quantized types use the scalar kernels.
//!
//! Each 32-element block's integer sum `Σ q_w · q_a` is taken with widening
//! multiplies (`smull`/`smlal`: two i8 products per i16 lane, at most
//! 2 · 128 · 127 < 2¹⁵) and pairwise widening adds; the f32 part is the
//! scalar kernel's expression in the same order, so results are bit-exact
//! with `scalar`.
//!
//! # Safety
//! Callers guarantee NEON (always present on aarch64) and the shape
//! preconditions checked by `dot::dot_quantized`.

use std::arch::aarch64::*;

use super::scalar;
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::{f16_at, Q4_0_QS, Q4_1_M, Q4_1_QS, Q8_0_QS, QK};
use crate::DType;

#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_quantized<const R: usize>(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    a: &[QRow<'_>; R],
    out: &mut [f32],
) {
    let row: unsafe fn(&[u8], &QRow<'_>) -> f32 = match dtype {
        DType::Q8_0 => dot_q8_0,
        DType::Q4_0 => dot_q4::<false>,
        DType::Q4_1 => dot_q4::<true>,
        _ => return scalar::dot_quantized(dtype, w, row_bytes, a, out),
    };
    for (w, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(R)) {
        for (o, a) in o.iter_mut().zip(a) {
            // SAFETY: forwarded preconditions.
            *o = unsafe { row(w, a) };
        }
    }
}

/// `Σ w_i · a_i` over 32 signed bytes each, exactly.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn block_isum(w0: int8x16_t, w1: int8x16_t, a: *const i8) -> i32 {
    // SAFETY: the caller's `a` points at 32 bytes.
    let (a0, a1) = unsafe { (vld1q_s8(a), vld1q_s8(a.add(16))) };
    let lo = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)), w0, a0);
    let hi = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(a1)), w1, a1);
    vaddvq_s32(vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
}

#[target_feature(enable = "neon")]
unsafe fn dot_q8_0(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(DType::Q8_0.block_bytes()).enumerate() {
        let q = block[Q8_0_QS..].as_ptr().cast::<i8>();
        // SAFETY: a Q8_0 block holds 32 quants after its scale; the
        // activation row holds block b.
        let isum = unsafe { block_isum(vld1q_s8(q), vld1q_s8(q.add(16)), a.qs[b * QK..].as_ptr()) };
        sum += (f16_at(block, 0) * a.ds[2 * b]) * isum as f32;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4<const HAS_MIN: bool>(w: &[u8], a: &QRow<'_>) -> f32 {
    let (dtype, qs_at) = if HAS_MIN {
        (DType::Q4_1, Q4_1_QS)
    } else {
        (DType::Q4_0, Q4_0_QS)
    };
    let low = vdupq_n_u8(0x0F);
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(dtype.block_bytes()).enumerate() {
        // SAFETY: 16 nibble bytes follow the block header; the activation
        // row holds block b.
        let isum = unsafe {
            let raw = vld1q_u8(block[qs_at..].as_ptr());
            // Low nibbles are elements 0..16, high nibbles 16..32.
            let w0 = vreinterpretq_s8_u8(vandq_u8(raw, low));
            let w1 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw));
            block_isum(w0, w1, a.qs[b * QK..].as_ptr())
        };
        let (da, s) = (a.ds[2 * b], a.ds[2 * b + 1]);
        let d = f16_at(block, 0);
        let m = if HAS_MIN {
            f16_at(block, Q4_1_M)
        } else {
            -8.0 * d
        };
        sum += (d * da) * isum as f32 + m * s;
    }
    sum
}
