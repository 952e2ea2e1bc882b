//! Q8_0: 32 elements in 34 bytes: f16 `d`, 32 × i8; value `q·d`.

use super::BlockFormat;
use crate::formats::encode::{amax, f16_round, inverse, push_f16};
use crate::formats::read::{f16_at, QK};
use crate::DType;

/// Where the quants start.
pub(crate) const Q8_0_QS: usize = 2;

pub struct Q8_0;

impl BlockFormat for Q8_0 {
    const DTYPE: DType = DType::Q8_0;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 34;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        for (o, q) in out.iter_mut().zip(&block[Q8_0_QS..Q8_0_QS + QK]) {
            *o = f32::from(*q as i8) * d;
        }
    }

    /// `d = amax / 127`, `x ≈ d · q`.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let d = f16_round(amax(block) / 127.0);
        let id = inverse(d);
        push_f16(out, d);
        out.extend(
            block
                .iter()
                .map(|v| ((v * id).round().clamp(-127.0, 127.0) as i8) as u8),
        );
    }
}
