//! Q4_1: 32 elements in 20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles
//! as Q4_0; value `q·d + m`.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16};
use crate::formats::read::{f16_at, q4_quant, QK};
use crate::DType;

/// Where the min and the nibbles start.
pub(crate) const Q4_1_M: usize = 2;
pub(crate) const Q4_1_QS: usize = 4;

pub struct Q4_1;

impl BlockFormat for Q4_1 {
    const DTYPE: DType = DType::Q4_1;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 20;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let m = f16_at(block, Q4_1_M);
        let qs = &block[Q4_1_QS..Q4_1_QS + QK / 2];
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(q4_quant(qs, j)) * d + m;
        }
    }

    /// `x ≈ d · q + m` with `m` the block minimum; nibbles as Q4_0.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let min = block.iter().copied().fold(f32::INFINITY, f32::min);
        let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = f16_round((max - min) / 15.0);
        let m = f16_round(min);
        let id = inverse(d);
        push_f16(out, d);
        push_f16(out, m);
        let q = |v: f32| ((v - m) * id).round().clamp(0.0, 15.0) as u8;
        let (lo, hi) = block.split_at(16);
        out.extend(lo.iter().zip(hi).map(|(&a, &b)| q(a) | (q(b) << 4)));
    }
}
