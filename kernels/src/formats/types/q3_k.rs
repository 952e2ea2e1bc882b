//! Q3_K: 256 elements in 110 bytes: 32 bytes of high bits, 64 bytes of
//! 2-bit quants, 12 bytes of 6-bit scales, f16 `d`; value `(d·sc)·q` per
//! 16-element sub-block, in ggml's order of f32 operations.

use super::BlockFormat;
use crate::formats::encode::{f16_round, inverse, push_f16, push_two_bits, signed_max};
use crate::formats::read::{f16_at, two_bits, QK_K};
use crate::DType;

/// Where the quants, the scales and `d` start.
pub(crate) const Q3K_QS: usize = 32;
pub(crate) const Q3K_SCALES: usize = 96;
pub(crate) const Q3K_D: usize = 108;

/// The quant (-4..4) of element `e` of a block: the two low bits, less 4
/// where the element's bit in the high-bit mask (bit `e / 32` of byte
/// `e % 32`) is clear.
#[inline]
pub(crate) fn q3k_quant(block: &[u8], e: usize) -> i8 {
    let low = two_bits(&block[Q3K_QS..Q3K_QS + 64], e) as i8;
    let high = (block[e % 32] >> (e / 32)) & 1;
    if high == 1 {
        low
    } else {
        low - 4
    }
}

/// Sub-block `j`'s scale (-32..32) from the 12 packed bytes: a low nibble
/// of bytes 0-7 (sub-blocks 0-7 the low nibbles, 8-15 the high ones) and
/// two high bits from bytes 8-11, offset by 32.
#[inline]
pub(crate) fn q3k_scale(scales: &[u8], j: usize) -> i8 {
    let low = if j < 8 {
        scales[j] & 0x0F
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

pub struct Q3K;

impl BlockFormat for Q3K {
    const DTYPE: DType = DType::Q3K;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 110;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, Q3K_D);
        let scales = &block[Q3K_SCALES..Q3K_SCALES + 12];
        for (j, out) in out.chunks_exact_mut(16).enumerate() {
            let dl = d * f32::from(q3k_scale(scales, j));
            for (l, o) in out.iter_mut().enumerate() {
                *o = dl * f32::from(q3k_quant(block, 16 * j + l));
            }
        }
    }

    /// 16 sub-blocks of 16, `x ≈ d·sc·q` with `q` in -4..4 and 6-bit signed
    /// `sc` (stored +32).
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        // The sub-block's largest magnitude maps to q = -4 (its sign in sc).
        let scales: Vec<f32> = block
            .chunks_exact(16)
            .map(|s| signed_max(s) / -4.0)
            .collect();
        let d = f16_round(scales.iter().fold(0.0f32, |m, s| m.max(s.abs())) / 31.0);
        let sc: Vec<i8> = scales
            .iter()
            .map(|&s| (s * inverse(d)).round().clamp(-32.0, 31.0) as i8)
            .collect();
        let q: Vec<i8> = block
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let step = d * f32::from(sc[i / 16]);
                (v * inverse(step)).round().clamp(-4.0, 3.0) as i8
            })
            .collect();
        // High-bit mask: bit k of byte l set when element 32k + l has q >= 0.
        let mut hmask = [0u8; 32];
        for (e, &v) in q.iter().enumerate() {
            if v >= 0 {
                hmask[e % 32] |= 1 << (e / 32);
            }
        }
        out.extend_from_slice(&hmask);
        let low: Vec<u8> = q.iter().map(|&v| (v + 4) as u8 & 3).collect();
        push_two_bits(&low, out);
        let stored: Vec<u8> = sc.iter().map(|&s| (s + 32) as u8).collect();
        let mut packed = [0u8; 12];
        for (j, &s) in stored.iter().enumerate() {
            packed[j % 8] |= (s & 0x0F) << (4 * (j / 8));
            packed[8 + j % 4] |= (s >> 4) << (2 * (j / 4));
        }
        out.extend_from_slice(&packed);
        push_f16(out, d);
    }
}
