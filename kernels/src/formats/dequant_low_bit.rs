//! Dequantization of the K types beside Q4_K/Q6_K and of the IQ4 types,
//! one block at a time, with ggml's formulas in ggml's order of f32
//! operations (so the values equal the `gguf` package's bit for bit):
//! Q2_K `(d·sc)·q - dmin·m` and Q3_K `(d·sc)·q` per 16 elements, Q5_K
//! `(d·sc)·q - dmin·m` per 32, IQ4_NL `d·T[q]`, IQ4_XS `(d·sc)·T[q]` per 32.

use super::blocks::{f16_at, q4_quant, q4k_scale_min, QK};
use super::blocks_iq4::{iq4xs_scale, IQ4NL_QS, IQ4XS_QS, IQ4_VALUES};
use super::blocks_k::{
    q2k_quant, q2k_scale_min, q3k_quant, q3k_scale, q5k_quant, Q2K_D, Q2K_DMIN, Q3K_D, Q3K_SCALES,
    Q5K_SCALES,
};

pub(super) fn q2_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, Q2K_D);
    let dmin = f16_at(block, Q2K_DMIN);
    for (j, out) in out.chunks_exact_mut(16).enumerate() {
        let (sc, m) = q2k_scale_min(block, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, o) in out.iter_mut().enumerate() {
            *o = dl * f32::from(q2k_quant(block, 16 * j + l)) - ml;
        }
    }
}

pub(super) fn q3_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, Q3K_D);
    let scales = &block[Q3K_SCALES..Q3K_SCALES + 12];
    for (j, out) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(q3k_scale(scales, j));
        for (l, o) in out.iter_mut().enumerate() {
            *o = dl * f32::from(q3k_quant(block, 16 * j + l));
        }
    }
}

pub(super) fn q5_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let scales = &block[Q5K_SCALES..Q5K_SCALES + 12];
    for (j, out) in out.chunks_exact_mut(QK).enumerate() {
        let (sc, m) = q4k_scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, o) in out.iter_mut().enumerate() {
            *o = dl * f32::from(q5k_quant(block, QK * j + l)) - ml;
        }
    }
}

pub(super) fn iq4_nl(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let qs = &block[IQ4NL_QS..IQ4NL_QS + QK / 2];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(IQ4_VALUES[usize::from(q4_quant(qs, j))]);
    }
}

pub(super) fn iq4_xs(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (j, out) in out.chunks_exact_mut(QK).enumerate() {
        let dl = d * f32::from(iq4xs_scale(block, j));
        let qs = &block[IQ4XS_QS + 16 * j..IQ4XS_QS + 16 * (j + 1)];
        for (l, o) in out.iter_mut().enumerate() {
            *o = dl * f32::from(IQ4_VALUES[usize::from(q4_quant(qs, l))]);
        }
    }
}
