//! Scalar dot products: the reference twins of the SIMD kernels.
//!
//! Quantized types follow the contract in `quant_act`: per 32-element
//! activation block `b`, an exact integer sum `Σ q_w · q_a` times
//! `w_scale · d_a`, plus `w_min · s_b` for types with an offset, summed in
//! f32 in block order. The SIMD kernels compute the same per-block terms and
//! differ only in the order the f32 sums are taken.

use super::scalar_low_bit;
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::{
    bf16_at, f16_at, f32_at, q4_quant, q4k_quant, q4k_scale_min, q6k_quant, u32_at, NibbleBlock,
    Q4K_DMIN, Q4K_SCALES, Q6K_D, Q6K_SCALES, Q8_0_QS, QK, QK_K,
};
use crate::DType;

/// `out[row · R + r] = W[row] · a[r]` for a quantized `dtype`, `w` holding
/// whole rows of `row_bytes`.
pub(crate) fn dot_quantized<const R: usize>(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    a: &[QRow<'_>; R],
    out: &mut [f32],
) {
    let dot: fn(&[u8], &QRow<'_>) -> f32 = match dtype {
        DType::Q8_0 => dot_q8_0,
        DType::Q4_0 => |w, a| dot_nibbles(w, a, NibbleBlock::of(false, false)),
        DType::Q4_1 => |w, a| dot_nibbles(w, a, NibbleBlock::of(true, false)),
        DType::Q5_0 => |w, a| dot_nibbles(w, a, NibbleBlock::of(false, true)),
        DType::Q5_1 => |w, a| dot_nibbles(w, a, NibbleBlock::of(true, true)),
        DType::Q4K => dot_q4k,
        DType::Q6K => dot_q6k,
        DType::Q2K => scalar_low_bit::dot_q2k,
        DType::Q3K => scalar_low_bit::dot_q3k,
        DType::Q5K => scalar_low_bit::dot_q5k,
        DType::IQ4NL => scalar_low_bit::dot_iq4nl,
        DType::IQ4XS => scalar_low_bit::dot_iq4xs,
        DType::F32 | DType::F16 | DType::BF16 => |_, _| f32::NAN,
    };
    for (w, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(R)) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = dot(w, a);
        }
    }
}

/// `out[row · R + r] = W[row] · x[r]` for a float `dtype`, summed in
/// element order.
pub(crate) fn dot_float<const R: usize>(
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

#[inline]
fn dot_float_row<const R: usize>(dtype: DType, w: &[u8], x: &[&[f32]; R], out: &mut [f32; R]) {
    let width = dtype.block_bytes();
    for (out, x) in out.iter_mut().zip(x) {
        let mut sum = 0.0f32;
        for (i, v) in x.iter().enumerate() {
            let weight = match dtype {
                DType::F16 => f16_at(w, i * width),
                DType::BF16 => bf16_at(w, i * width),
                _ => f32_at(w, 4 * i),
            };
            sum += weight * v;
        }
        *out = sum;
    }
}

fn block_ds(a: &QRow<'_>, b: usize) -> (f32, f32) {
    (a.ds[2 * b], a.ds[2 * b + 1])
}

fn dot_q8_0(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(DType::Q8_0.block_bytes()).enumerate() {
        let (da, _) = block_ds(a, b);
        let qa = &a.qs[b * QK..(b + 1) * QK];
        let isum: i32 = block[Q8_0_QS..Q8_0_QS + QK]
            .iter()
            .zip(qa)
            .map(|(w, a)| i32::from(*w as i8) * i32::from(*a))
            .sum();
        sum += (f16_at(block, 0) * da) * isum as f32;
    }
    sum
}

/// Q4_0, Q4_1, Q5_0 and Q5_1, each as `q·d + m` (Q4_0's `(q-8)·d` has
/// `m = -8d`, Q5_0's `(q-16)·d` `m = -16d`).
fn dot_nibbles(w: &[u8], a: &QRow<'_>, layout: NibbleBlock) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(layout.bytes).enumerate() {
        let (da, s) = block_ds(a, b);
        let d = f16_at(block, 0);
        let m = match layout.min {
            Some(at) => f16_at(block, at),
            None => -layout.offset * d,
        };
        let qh = layout.qh.map_or(0, |at| u32_at(block, at));
        let qs = &block[layout.qs..layout.qs + QK / 2];
        let qa = &a.qs[b * QK..(b + 1) * QK];
        let isum: i32 = qa
            .iter()
            .enumerate()
            .map(|(j, a)| {
                let q = q4_quant(qs, j) | ((((qh >> j) & 1) as u8) << 4);
                i32::from(q) * i32::from(*a)
            })
            .sum();
        sum += (d * da) * isum as f32 + m * s;
    }
    sum
}

fn dot_q4k(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::Q4K.block_bytes()).enumerate() {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, Q4K_DMIN);
        let scales = &block[Q4K_SCALES..Q4K_SCALES + 12];
        for sub in 0..QK_K / QK {
            let b = i * (QK_K / QK) + sub;
            let (da, s) = block_ds(a, b);
            let (sc, m) = q4k_scale_min(scales, sub);
            let qa = &a.qs[b * QK..(b + 1) * QK];
            let isum: i32 = qa
                .iter()
                .enumerate()
                .map(|(l, a)| i32::from(q4k_quant(block, sub * QK + l)) * i32::from(*a))
                .sum();
            let scale = d * f32::from(sc);
            let min = -(dmin * f32::from(m));
            sum += (scale * da) * isum as f32 + min * s;
        }
    }
    sum
}

fn dot_q6k(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::Q6K.block_bytes()).enumerate() {
        let d = f16_at(block, Q6K_D);
        for sub in 0..QK_K / QK {
            let b = i * (QK_K / QK) + sub;
            let (da, _) = block_ds(a, b);
            let mut isum = 0i32;
            for half in 0..2 {
                let mut part = 0i32;
                let mut scale_index = 0;
                for l in 0..16 {
                    let e = sub * QK + half * 16 + l;
                    let (q, si) = q6k_quant(block, e);
                    scale_index = si;
                    part += (i32::from(q) - 32) * i32::from(a.qs[b * QK + half * 16 + l]);
                }
                isum += i32::from(block[Q6K_SCALES + scale_index] as i8) * part;
            }
            sum += (d * da) * isum as f32;
        }
    }
    sum
}
