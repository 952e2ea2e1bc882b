//! Q5_K: 256 elements in 176 bytes: f16 `d`, f16 `dmin`, 12 bytes of
//! scales and mins as Q4_K, 32 bytes of fifth bits, 128 bytes of nibbles;
//! value `(d·sc)·q - dmin·m` per 32-element sub-block.

use super::BlockFormat;
use crate::formats::encode::{inverse, pack_k_scales, push_f16, scale_min, two_level};
use crate::formats::read::{f16_at, q4k_scale_min, QK, QK_K};
use crate::DType;

/// Where the scales, the fifth bits and the nibbles start.
pub(crate) const Q5K_SCALES: usize = 4;
pub(crate) const Q5K_QH: usize = 16;
pub(crate) const Q5K_QS: usize = 48;

/// The 5-bit quant of element `e` of a block: Q4_K's nibble order, plus
/// bit `e / 32` of fifth-bit byte `e % 32`.
#[inline]
pub(crate) fn q5k_quant(block: &[u8], e: usize) -> u8 {
    let byte = block[Q5K_QS + 32 * (e / 64) + e % 32];
    let low = if (e % 64) < 32 {
        byte & 0x0F
    } else {
        byte >> 4
    };
    let high = (block[Q5K_QH + e % 32] >> (e / 32)) & 1;
    low | (high << 4)
}

pub struct Q5K;

impl BlockFormat for Q5K {
    const DTYPE: DType = DType::Q5K;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 176;

    fn dequantize(block: &[u8], out: &mut [f32]) {
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

    /// As Q4_K with 5-bit quants: the fifth bit of element `32k + l` is bit
    /// `k` of byte `l` of 32 bytes before the nibbles.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let pairs: Vec<_> = block.chunks_exact(32).map(|s| scale_min(s, 31.0)).collect();
        let (d, dmin, sc, m) = two_level(&pairs, 63.0);
        push_f16(out, d);
        push_f16(out, dmin);
        out.extend_from_slice(&pack_k_scales(&sc, &m));
        let q: Vec<u8> = block
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let j = i / 32;
                let offset = dmin * f32::from(m[j]);
                ((v + offset) * inverse(d * f32::from(sc[j])))
                    .round()
                    .clamp(0.0, 31.0) as u8
            })
            .collect();
        let mut qh = [0u8; 32];
        for (e, &v) in q.iter().enumerate() {
            qh[e % 32] |= (v >> 4) << (e / 32);
        }
        out.extend_from_slice(&qh);
        for group in q.chunks_exact(64) {
            let (lo, hi) = group.split_at(32);
            out.extend(
                lo.iter()
                    .zip(hi)
                    .map(|(&a, &b)| (a & 0x0F) | ((b & 0x0F) << 4)),
            );
        }
    }
}
