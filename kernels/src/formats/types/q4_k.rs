//! Q4_K: 256 elements in 144 bytes: f16 `d`, f16 `dmin`, 12 bytes of
//! 6-bit scales and mins (see `blocks::q4k_scale_min`), 128 bytes of
//! nibbles; value `d·sc·q - dmin·m` per 32-element sub-block.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, pack_k_scales, push_f16};
use crate::formats::read::{f16_at, q4k_scale_min, QK, QK_K};
use crate::DType;

/// Where `dmin`, the scales and the nibbles start.
pub(crate) const Q4K_DMIN: usize = 2;
pub(crate) const Q4K_SCALES: usize = 4;
pub(crate) const Q4K_QS: usize = 16;

/// The 4-bit quant of element `e` (0..256) of a block. Each 64 elements
/// share 32 bytes: the first 32 take the low nibbles, the next 32 the high
/// ones.
#[inline]
pub(crate) fn q4k_quant(block: &[u8], e: usize) -> u8 {
    let byte = block[Q4K_QS + 32 * (e / 64) + e % 32];
    if (e % 64) < 32 {
        byte & 0x0F
    } else {
        byte >> 4
    }
}

pub struct Q4K;

impl BlockFormat for Q4K {
    const DTYPE: DType = DType::Q4K;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 144;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, Q4K_DMIN);
        let scales = &block[Q4K_SCALES..Q4K_SCALES + 12];
        for (sub, out) in out.chunks_exact_mut(QK).enumerate() {
            let (sc, m) = q4k_scale_min(scales, sub);
            let scale = d * f32::from(sc);
            let min = dmin * f32::from(m);
            for (l, o) in out.iter_mut().enumerate() {
                *o = scale * f32::from(q4k_quant(block, sub * QK + l)) - min;
            }
        }
    }

    /// 8 sub-blocks of 32, `x ≈ d · sc[j] · q - dmin · m[j]` with 6-bit
    /// `sc` and `m` packed in 12 bytes; 128 bytes of nibbles where each
    /// 32-byte group holds sub-block `2k` (low nibbles) and `2k + 1` (high).
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        // ggml keeps sub-block minimums at or below zero so `m` is non-negative.
        let mins: Vec<f32> = block
            .chunks_exact(32)
            .map(|s| -s.iter().copied().fold(0.0f32, f32::min))
            .collect();
        let dmin = f16_round(mins.iter().copied().fold(0.0, f32::max) / 63.0);
        // Round the offsets up so each sub-block's minimum stays representable.
        let m: Vec<u8> = mins
            .iter()
            .map(|&v| (v * inverse(dmin)).ceil().clamp(0.0, 63.0) as u8)
            .collect();
        let scales: Vec<f32> = block
            .chunks_exact(32)
            .zip(&m)
            .map(|(s, &mj)| {
                let max = s.iter().copied().fold(0.0f32, f32::max);
                (max + dmin * f32::from(mj)) / 15.0
            })
            .collect();
        let d = f16_round(scales.iter().copied().fold(0.0, f32::max) / 63.0);
        let sc: Vec<u8> = scales
            .iter()
            .map(|&s| (s * inverse(d)).ceil().clamp(0.0, 63.0) as u8)
            .collect();

        push_f16(out, d);
        push_f16(out, dmin);
        out.extend_from_slice(&pack_k_scales(&sc, &m));

        let q: Vec<u8> = block
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let j = i / 32;
                let step = d * f32::from(sc[j]);
                let offset = dmin * f32::from(m[j]);
                ((v + offset) * inverse(step)).round().clamp(0.0, 15.0) as u8
            })
            .collect();
        for group in q.chunks_exact(64) {
            let (lo, hi) = group.split_at(32);
            out.extend(lo.iter().zip(hi).map(|(&a, &b)| a | (b << 4)));
        }
    }
}
