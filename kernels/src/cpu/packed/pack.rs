//! Sixteen checkpoint rows into one group of the layout in the module
//! documentation.

use super::layout::{has_min, Layout, GROUP_ROWS};
use crate::formats::blocks::{
    q4k_scale_min, q6k_quant, NibbleBlock, Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_SCALES,
};
use crate::DType;

/// Writes the group of `rows` (sixteen rows of `row_bytes`) into `out`
/// (`layout.group_bytes(blocks)` bytes, zeroed padding left as it is).
pub(super) fn group(dtype: DType, layout: Layout, rows: &[u8], row_bytes: usize, out: &mut [u8]) {
    let bb = dtype.block_bytes();
    for (r, row) in rows.chunks_exact(row_bytes).take(GROUP_ROWS).enumerate() {
        for (b, block) in row.chunks_exact(bb).enumerate() {
            let (q_at, p_at) = layout.block(b);
            let (q, parts) = (&mut out[q_at..q_at + layout.qb], p_at);
            match dtype {
                DType::Q4K => {
                    q4k(block, r, q);
                    q4k_parts(block, r, &mut out[parts..parts + layout.pb]);
                }
                DType::Q6K => {
                    q6k(block, r, q);
                    q6k_parts(block, r, &mut out[parts..parts + layout.pb]);
                }
                _ => {
                    small(dtype, block, r, q);
                    let p = &mut out[parts..parts + layout.pb];
                    p[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
                    if has_min(dtype) {
                        p[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&block[2..4]);
                    }
                }
            }
        }
    }
}

/// Row `r`'s quants of one 32-element block.
fn small(dtype: DType, block: &[u8], r: usize, q: &mut [u8]) {
    if dtype == DType::Q8_0 {
        for w in 0..8 {
            for e in 0..4 {
                q[64 * w + 4 * r + e] = block[2 + 4 * w + e] ^ 0x80;
            }
        }
        return;
    }
    let layout = NibbleBlock::of(has_min(dtype), matches!(dtype, DType::Q5_0 | DType::Q5_1));
    for w in 0..4 {
        let at = layout.qs + 4 * w;
        q[64 * w + 4 * r..64 * w + 4 * r + 4].copy_from_slice(&block[at..at + 4]);
    }
    if let Some(at) = layout.qh {
        // Element `j`'s fifth bit to bit `j / 4` of byte `4r + j % 4`.
        let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        let bytes = &mut q[256 + 4 * r..256 + 4 * r + 4];
        bytes.fill(0);
        for j in 0..32 {
            bytes[j % 4] |= (((qh >> j) & 1) as u8) << (j / 4);
        }
    }
}

/// Row `r`'s nibble bytes of a Q4_K block: pair `p`, word `w`.
fn q4k(block: &[u8], r: usize, q: &mut [u8]) {
    for p in 0..4 {
        for w in 0..8 {
            let at = Q4K_QS + 32 * p + 4 * w;
            let to = 512 * p + 64 * w + 4 * r;
            q[to..to + 4].copy_from_slice(&block[at..at + 4]);
        }
    }
}

/// Row `r`'s `d`, `dmin` and byte scales and mins of a Q4_K block.
fn q4k_parts(block: &[u8], r: usize, p: &mut [u8]) {
    p[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
    p[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&block[2..4]);
    let scales = &block[Q4K_SCALES..Q4K_SCALES + 12];
    for j in 0..8 {
        let (sc, m) = q4k_scale_min(scales, j);
        p[64 + 16 * j + r] = sc;
        p[192 + 16 * j + r] = m;
    }
}

/// Row `r`'s unsigned 6-bit quants of a Q6_K block, a byte each.
fn q6k(block: &[u8], r: usize, q: &mut [u8]) {
    for e in 0..256 {
        let (j, w, i) = (e / 32, (e % 32) / 4, e % 4);
        q[512 * j + 64 * w + 4 * r + i] = q6k_quant(block, e).0;
    }
}

/// Row `r`'s `d` and sixteen i8 scales of a Q6_K block.
fn q6k_parts(block: &[u8], r: usize, p: &mut [u8]) {
    p[2 * r..2 * r + 2].copy_from_slice(&block[Q6K_D..Q6K_D + 2]);
    for h in 0..16 {
        p[32 + 16 * h + r] = block[Q6K_SCALES + h];
    }
}
