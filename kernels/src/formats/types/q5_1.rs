//! Q5_1: 32 elements in 24 bytes: f16 `d`, f16 `m`, a u32 of fifth bits,
//! 16 bytes of nibbles; value `q·d + m`.

use super::q5_0::push_q5;
use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16};
use crate::formats::read::{f16_at, q5_quant, u32_at, QK};
use crate::DType;

/// Where the min, the fifth bits and the nibbles start.
pub(crate) const Q5_1_M: usize = 2;
pub(crate) const Q5_1_QH: usize = 4;
pub(crate) const Q5_1_QS: usize = 8;

pub struct Q5_1;

impl BlockFormat for Q5_1 {
    const DTYPE: DType = DType::Q5_1;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 24;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let m = f16_at(block, Q5_1_M);
        let qh = u32_at(block, Q5_1_QH);
        let qs = &block[Q5_1_QS..Q5_1_QS + QK / 2];
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(q5_quant(qh, qs, j)) * d + m;
        }
    }

    /// `x ≈ d · q + m` with `m` the block minimum.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let min = block.iter().copied().fold(f32::INFINITY, f32::min);
        let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = f16_round((max - min) / 31.0);
        let m = f16_round(min);
        let id = inverse(d);
        push_f16(out, d);
        push_f16(out, m);
        let q: Vec<u8> = block
            .iter()
            .map(|v| ((v - m) * id).round().clamp(0.0, 31.0) as u8)
            .collect();
        push_q5(&q, out);
    }
}
