//! Q2_K: 256 elements in 84 bytes: 16 bytes of scale/min nibbles, 64
//! bytes of 2-bit quants, f16 `d`, f16 `dmin`; value `(d·sc)·q - dmin·m`
//! per 16-element sub-block, in ggml's order of f32 operations.

use super::BlockFormat;
use crate::formats::encode::{inverse, push_f16, push_two_bits, scale_min, two_level};
use crate::formats::read::{f16_at, two_bits, QK_K};
use crate::DType;

/// Where the quants, `d` and `dmin` start.
pub(crate) const Q2K_QS: usize = 16;
pub(crate) const Q2K_D: usize = 80;
pub(crate) const Q2K_DMIN: usize = 82;

/// The quant (0..4) of element `e` of a block.
#[inline]
pub(crate) fn q2k_quant(block: &[u8], e: usize) -> u8 {
    two_bits(&block[Q2K_QS..Q2K_QS + 64], e)
}

/// Sub-block `j`'s (scale, min), both 4-bit: byte `j`'s low and high
/// nibbles.
#[inline]
pub(crate) fn q2k_scale_min(block: &[u8], j: usize) -> (u8, u8) {
    (block[j] & 0x0F, block[j] >> 4)
}

pub struct Q2K;

impl BlockFormat for Q2K {
    const DTYPE: DType = DType::Q2K;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 84;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, Q2K_D);
        let dmin = f16_at(block, Q2K_DMIN);
        for (j, out) in out.chunks_exact_mut(16).enumerate() {
            let (sc, m) = q2k_scale_min(block, j);
            let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
            for (l, o) in out.iter_mut().enumerate() {
                *o = dl * f32::from(q2k_quant(block, 16 * j + l)) - ml;
            }
        }
    }

    /// 16 sub-blocks of 16, `x ≈ d·sc·q - dmin·m`, 4-bit `sc` and `m`.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let pairs: Vec<_> = block.chunks_exact(16).map(|s| scale_min(s, 3.0)).collect();
        let (d, dmin, sc, m) = two_level(&pairs, 15.0);
        let q: Vec<u8> = block
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let j = i / 16;
                let offset = dmin * f32::from(m[j]);
                ((v + offset) * inverse(d * f32::from(sc[j])))
                    .round()
                    .clamp(0.0, 3.0) as u8
            })
            .collect();
        out.extend(sc.iter().zip(&m).map(|(s, m)| s | (m << 4)));
        push_two_bits(&q, out);
        push_f16(out, d);
        push_f16(out, dmin);
    }
}
