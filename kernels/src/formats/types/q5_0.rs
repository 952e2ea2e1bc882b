//! Q5_0: 32 elements in 22 bytes: f16 `d`, a u32 of fifth bits (bit `j`:
//! element `j`), 16 bytes of nibbles as Q4_0; value `(q - 16)·d`.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16, signed_max};
use crate::formats::read::{f16_at, q5_quant, u32_at, QK};
use crate::DType;

/// Where the fifth bits and the nibbles start.
pub(crate) const Q5_0_QH: usize = 2;
pub(crate) const Q5_0_QS: usize = 6;

pub struct Q5_0;

/// The 32 quants (0..32) of a Q5 block as ggml stores them: the u32 of
/// fifth bits (bit j for element j), then nibbles as Q4_0 (Q5_0, Q5_1).
pub(super) fn push_q5(q: &[u8], out: &mut Vec<u8>) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, v)| h | (u32::from(v >> 4) << j));
    out.extend_from_slice(&qh.to_le_bytes());
    let (lo, hi) = q.split_at(16);
    out.extend(lo.iter().zip(hi).map(|(&a, &b)| (a & 0x0F) | (b << 4)));
}

impl BlockFormat for Q5_0 {
    const DTYPE: DType = DType::Q5_0;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 22;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let qh = u32_at(block, Q5_0_QH);
        let qs = &block[Q5_0_QS..Q5_0_QS + QK / 2];
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(q5_quant(qh, qs, j) as i8 - 16) * d;
        }
    }

    /// The element of largest magnitude maps to -16, `x ≈ d · (q - 16)`.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let d = f16_round(signed_max(block) / -16.0);
        let id = inverse(d);
        push_f16(out, d);
        let q: Vec<u8> = block
            .iter()
            .map(|v| (v * id + 16.5).floor().clamp(0.0, 31.0) as u8)
            .collect();
        push_q5(&q, out);
    }
}
