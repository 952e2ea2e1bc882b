//! Scalar dot products of Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS: the
//! reference twins of their SIMD kernels, under `quant_act`'s contract.
//!
//! Per 32-element activation block `b` each takes an exact integer sum and
//! scales it once: the 16-element sub-blocks of Q2_K and Q3_K fold their
//! integer scales (and Q2_K its integer mins, against `Σq_a` over the 16)
//! into the integer sum, as do IQ4_XS's sub-block scales:
//!
//! - Q2_K: `(d·d_a)·Σ_j sc_j Σ q·q_a - (dmin·d_a)·Σ_j m_j Σ q_a`
//! - Q3_K: `(d·d_a)·Σ_j sc_j Σ q·q_a`
//! - Q5_K: `(d·sc·d_a)·Σ q·q_a - (dmin·m)·s` (as Q4_K)
//! - IQ4_NL: `(d·d_a)·Σ T[q]·q_a`; IQ4_XS: `(d·d_a)·(sc·Σ T[q]·q_a)`

use crate::cpu::quant_act::QRow;
use crate::formats::blocks::{f16_at, q4_quant, q4k_scale_min, QK, QK_K};
use crate::formats::blocks::{iq4xs_scale, IQ4NL_QS, IQ4XS_QS, IQ4_VALUES};
use crate::formats::blocks::{
    q2k_quant, q2k_scale_min, q3k_quant, q3k_scale, q5k_quant, Q2K_D, Q2K_DMIN, Q3K_D, Q3K_SCALES,
    Q5K_SCALES,
};
use crate::DType;

/// Activation block `b`'s `(d, s)` and its 32 quants.
fn act<'a>(a: &QRow<'a>, b: usize) -> (f32, f32, &'a [i8]) {
    (a.ds[2 * b], a.ds[2 * b + 1], &a.qs[b * QK..(b + 1) * QK])
}

/// `Σ q(l) · qa[l]` over the 16 or 32 elements of `qa`.
fn isum(qa: &[i8], q: impl Fn(usize) -> i32) -> i32 {
    qa.iter()
        .enumerate()
        .map(|(l, a)| q(l) * i32::from(*a))
        .sum()
}

pub(super) fn dot_q2k(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::Q2K.block_bytes()).enumerate() {
        let (d, dmin) = (f16_at(block, Q2K_D), f16_at(block, Q2K_DMIN));
        for sub in 0..QK_K / QK {
            let (da, _, qa) = act(a, 8 * i + sub);
            let (mut scaled, mut mins) = (0i32, 0i32);
            for (half, qa) in qa.chunks_exact(16).enumerate() {
                let j = 2 * sub + half;
                let (sc, m) = q2k_scale_min(block, j);
                scaled += i32::from(sc) * isum(qa, |l| i32::from(q2k_quant(block, 16 * j + l)));
                mins += i32::from(m) * qa.iter().map(|v| i32::from(*v)).sum::<i32>();
            }
            sum += (d * da) * scaled as f32 - (dmin * da) * mins as f32;
        }
    }
    sum
}

pub(super) fn dot_q3k(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::Q3K.block_bytes()).enumerate() {
        let d = f16_at(block, Q3K_D);
        let scales = &block[Q3K_SCALES..Q3K_SCALES + 12];
        for sub in 0..QK_K / QK {
            let (da, _, qa) = act(a, 8 * i + sub);
            let mut scaled = 0i32;
            for (half, qa) in qa.chunks_exact(16).enumerate() {
                let j = 2 * sub + half;
                let sc = i32::from(q3k_scale(scales, j));
                scaled += sc * isum(qa, |l| i32::from(q3k_quant(block, 16 * j + l)));
            }
            sum += (d * da) * scaled as f32;
        }
    }
    sum
}

pub(super) fn dot_q5k(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::Q5K.block_bytes()).enumerate() {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let scales = &block[Q5K_SCALES..Q5K_SCALES + 12];
        for sub in 0..QK_K / QK {
            let (da, s, qa) = act(a, 8 * i + sub);
            let (sc, m) = q4k_scale_min(scales, sub);
            let isum = isum(qa, |l| i32::from(q5k_quant(block, QK * sub + l)));
            let scale = d * f32::from(sc);
            let min = -(dmin * f32::from(m));
            sum += (scale * da) * isum as f32 + min * s;
        }
    }
    sum
}

/// `Σ T[q] · q_a` over one 32-element block of IQ4 index nibbles `qs`.
fn iq4_isum(qs: &[u8], qa: &[i8]) -> i32 {
    isum(qa, |l| i32::from(IQ4_VALUES[usize::from(q4_quant(qs, l))]))
}

pub(super) fn dot_iq4nl(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(DType::IQ4NL.block_bytes()).enumerate() {
        let (da, _, qa) = act(a, b);
        let isum = iq4_isum(&block[IQ4NL_QS..IQ4NL_QS + QK / 2], qa);
        sum += (f16_at(block, 0) * da) * isum as f32;
    }
    sum
}

pub(super) fn dot_iq4xs(w: &[u8], a: &QRow<'_>) -> f32 {
    let mut sum = 0.0f32;
    for (i, block) in w.chunks_exact(DType::IQ4XS.block_bytes()).enumerate() {
        let d = f16_at(block, 0);
        for sub in 0..QK_K / QK {
            let (da, _, qa) = act(a, 8 * i + sub);
            let qs = &block[IQ4XS_QS + 16 * sub..IQ4XS_QS + 16 * (sub + 1)];
            let scaled = i32::from(iq4xs_scale(block, sub)) * iq4_isum(qs, qa);
            sum += (d * da) * scaled as f32;
        }
    }
    sum
}
