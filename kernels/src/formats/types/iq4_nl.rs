//! IQ4_NL: 32 elements in 18 bytes: f16 `d`, 16 bytes of 4-bit indices
//! (element `j` low, `j + 16` high) into one fixed non-linear table of
//! sixteen i8 values; value `d·T[q]`.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16, signed_max};
use crate::formats::read::{f16_at, q4_quant, QK};
use crate::DType;

/// ggml's `kvalues_iq4nl` (IQ4_NL, IQ4_XS).
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Where the indices start.
pub(crate) const IQ4NL_QS: usize = 2;

/// The IQ4 index nearest `v / dl`.
fn iq4_index(v: f32, dl: f32) -> u8 {
    let x = v * inverse(dl);
    let mut best = 0;
    for (k, t) in IQ4_VALUES.iter().enumerate() {
        if (f32::from(*t) - x).abs() < (f32::from(IQ4_VALUES[best]) - x).abs() {
            best = k;
        }
    }
    best as u8
}

/// The largest magnitude of `sub`, signed, over the table's -127: the
/// scale that maps it to the table's first entry.
pub(super) fn iq4_scale(sub: &[f32]) -> f32 {
    signed_max(sub) / -127.0
}

/// 32 indices as 16 bytes: element `j` low, `j + 16` high.
pub(super) fn push_nibbles(sub: &[f32], dl: f32, out: &mut Vec<u8>) {
    let (lo, hi) = sub.split_at(16);
    out.extend(
        lo.iter()
            .zip(hi)
            .map(|(&a, &b)| iq4_index(a, dl) | (iq4_index(b, dl) << 4)),
    );
}

pub struct IQ4NL;

impl BlockFormat for IQ4NL {
    const DTYPE: DType = DType::IQ4NL;
    const BLOCK_LEN: usize = QK;
    const BLOCK_BYTES: usize = 18;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let qs = &block[IQ4NL_QS..IQ4NL_QS + QK / 2];
        for (j, o) in out.iter_mut().enumerate() {
            *o = d * f32::from(IQ4_VALUES[usize::from(q4_quant(qs, j))]);
        }
    }

    /// `x ≈ d · T[q]`.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let d = f16_round(iq4_scale(block));
        push_f16(out, d);
        push_nibbles(block, d, out);
    }
}
