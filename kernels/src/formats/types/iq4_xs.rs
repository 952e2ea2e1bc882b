//! IQ4_XS: 256 elements in 136 bytes: f16 `d`, a u16 of high scale bits,
//! 4 bytes of low scale nibbles, 128 bytes of indices into IQ4_NL's table;
//! eight sub-blocks of 32, each with a 6-bit scale `ls`, value
//! `d·(ls - 32)·T[q]`.

use super::iq4_nl::{iq4_scale, push_nibbles, IQ4_VALUES};
use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16};
use crate::formats::read::{f16_at, q4_quant, QK, QK_K};
use crate::DType;

/// Where the high scale bits, the low scale nibbles and the indices start.
pub(crate) const IQ4XS_SCALES_H: usize = 2;
pub(crate) const IQ4XS_SCALES_L: usize = 4;
pub(crate) const IQ4XS_QS: usize = 8;

/// Sub-block `j`'s scale less 32 (-32..32): the nibble `j % 2` of
/// low-scale byte `j / 2`, and bits `2j..2j+2` of the u16 of high bits.
#[inline]
pub(crate) fn iq4xs_scale(block: &[u8], j: usize) -> i8 {
    let low = (block[IQ4XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F;
    let high_bits = u16::from_le_bytes([block[IQ4XS_SCALES_H], block[IQ4XS_SCALES_H + 1]]);
    let high = ((high_bits >> (2 * j)) & 3) as u8;
    (low | (high << 4)) as i8 - 32
}

pub struct IQ4XS;

impl BlockFormat for IQ4XS {
    const DTYPE: DType = DType::IQ4XS;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 136;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        for (j, out) in out.chunks_exact_mut(QK).enumerate() {
            let dl = d * f32::from(iq4xs_scale(block, j));
            let qs = &block[IQ4XS_QS + 16 * j..IQ4XS_QS + 16 * (j + 1)];
            for (l, o) in out.iter_mut().enumerate() {
                *o = dl * f32::from(IQ4_VALUES[usize::from(q4_quant(qs, l))]);
            }
        }
    }

    /// 8 sub-blocks of 32, `x ≈ d · (ls - 32) · T[q]` with 6-bit `ls`.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let scales: Vec<f32> = block.chunks_exact(32).map(iq4_scale).collect();
        let d = f16_round(scales.iter().fold(0.0f32, |m, s| m.max(s.abs())) / 31.0);
        let ls: Vec<i8> = scales
            .iter()
            .map(|&s| (s * inverse(d)).round().clamp(-32.0, 31.0) as i8)
            .collect();
        push_f16(out, d);
        let stored: Vec<u8> = ls.iter().map(|&l| (l + 32) as u8).collect();
        let high = stored
            .iter()
            .enumerate()
            .fold(0u16, |h, (j, &s)| h | (u16::from(s >> 4) << (2 * j)));
        out.extend_from_slice(&high.to_le_bytes());
        out.extend(
            stored
                .chunks_exact(2)
                .map(|p| (p[0] & 0x0F) | ((p[1] & 0x0F) << 4)),
        );
        for (sub, &l) in block.chunks_exact(32).zip(&ls) {
            push_nibbles(sub, d * f32::from(l), out);
        }
    }
}
