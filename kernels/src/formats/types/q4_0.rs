//! Q4_0: 32 elements in 18 bytes: f16 `d`, 16 bytes of nibbles (element
//! `j` low, `j + 16` high); value `(q - 8)·d`.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16, signed_max};
use crate::formats::read::{f16_at, q4_quant, QK};
use crate::DType;

/// Where the nibbles start.
pub(crate) const Q4_0_QS: usize = 2;

pub struct Q4_0;

impl BlockFormat for Q4_0 {
    const DTYPE: DType = DType::Q4_0;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 18;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let qs = &block[Q4_0_QS..Q4_0_QS + QK / 2];
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(q4_quant(qs, j) as i8 - 8) * d;
        }
    }

    /// The element of largest magnitude maps to -8, `x ≈ d · (q - 8)`;
    /// byte `j` holds element `j` (low nibble) and element `j + 16` (high).
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let d = f16_round(signed_max(block) / -8.0);
        let id = inverse(d);
        push_f16(out, d);
        let q = |v: f32| (v * id + 8.5).floor().clamp(0.0, 15.0) as u8;
        let (lo, hi) = block.split_at(16);
        out.extend(lo.iter().zip(hi).map(|(&a, &b)| q(a) | (q(b) << 4)));
    }
}
