//! Q6_K: 256 elements in 210 bytes: 128 bytes of low nibbles, 64 bytes of
//! high 2-bit pairs, 16 × i8 scales, f16 `d` last; value `d·sc·(q - 32)`
//! per 16-element sub-block.

use super::BlockFormat;
use crate::formats::encode::{amax, f16_round, inverse, push_f16};
use crate::formats::read::{f16_at, QK_K};
use crate::DType;

/// Where the high bits, the scales and `d` start.
pub(crate) const Q6K_QH: usize = 128;
pub(crate) const Q6K_SCALES: usize = 192;
pub(crate) const Q6K_D: usize = 208;

/// The 6-bit quant (0..64, not yet offset by -32) of element `e` (0..256)
/// and the index of its 16-element scale, as in ggml's
/// `dequantize_row_q6_K`.
#[inline]
pub(crate) fn q6k_quant(block: &[u8], e: usize) -> (u8, usize) {
    let half = e / 128;
    let r = e % 128;
    let quarter = r / 32;
    let l = r % 32;
    let low = block[64 * half + l + 32 * (quarter & 1)];
    let nibble = if quarter < 2 { low & 0x0F } else { low >> 4 };
    let high = (block[Q6K_QH + 32 * half + l] >> (2 * quarter)) & 3;
    (nibble | (high << 4), 8 * half + r / 16)
}

pub struct Q6K;

impl BlockFormat for Q6K {
    const DTYPE: DType = DType::Q6K;
    const BLOCK_LEN: usize = QK_K;
    const BLOCK_BYTES: usize = 210;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, Q6K_D);
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let (q, scale_index) = q6k_quant(block, e);
            let sc = block[Q6K_SCALES + scale_index] as i8;
            *o = d * f32::from(sc) * f32::from(q as i8 - 32);
        }
    }

    /// 16 sub-blocks of 16, `x ≈ d · sc[j] · (q - 32)` with 6-bit `q` (low
    /// 4 bits in `ql`, high 2 bits in `qh`) and i8 `sc`; then `d` last.
    fn quantize(block: &[f32], out: &mut Vec<u8>) {
        let scales: Vec<f32> = block.chunks_exact(16).map(|s| amax(s) / 31.0).collect();
        let d = f16_round(scales.iter().copied().fold(0.0, f32::max) / 127.0);
        let sc: Vec<i8> = scales
            .iter()
            .map(|&s| (s * inverse(d)).ceil().clamp(0.0, 127.0) as i8)
            .collect();
        let q: Vec<u8> = block
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let step = d * f32::from(sc[i / 16]);
                ((v * inverse(step)).round().clamp(-32.0, 31.0) + 32.0) as u8
            })
            .collect();

        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for (half, lq) in q.chunks_exact(128).enumerate() {
            let (ql, qh) = (&mut ql[half * 64..], &mut qh[half * 32..]);
            for l in 0..32 {
                let (a, b, c, e) = (lq[l], lq[l + 32], lq[l + 64], lq[l + 96]);
                ql[l] = (a & 0x0F) | ((c & 0x0F) << 4);
                ql[l + 32] = (b & 0x0F) | ((e & 0x0F) << 4);
                qh[l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(sc.iter().map(|&s| s as u8));
        push_f16(out, d);
    }
}
