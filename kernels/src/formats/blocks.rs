//! What the block types share (see `types/` for each type's own layout):
//! the little-endian readers, the nibble and K-scale accessors several
//! types use, and every type's offsets re-exported for the kernels.
//!
//! | type | elements | bytes | layout |
//! |------|----------|-------|--------|
//! | Q8_0 | 32  | 34  | f16 d, 32 × i8 |
//! | Q4_0 | 32  | 18  | f16 d, 16 B nibbles (element j low, j+16 high), value (q-8)·d |
//! | Q4_1 | 32  | 20  | f16 d, f16 m, 16 B nibbles, value q·d + m |
//! | Q4_K | 256 | 144 | f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles |
//! | Q6_K | 256 | 210 | 128 B low nibbles, 64 B high 2-bit pairs, 16 × i8 scales, f16 d |
//! | Q5_0 | 32  | 22  | f16 d, u32 fifth bits (bit j: element j), 16 B nibbles as Q4_0, value (q-16)·d |
//! | Q5_1 | 32  | 24  | f16 d, f16 m, u32 fifth bits, 16 B nibbles, value q·d + m |

/// Elements per block of the 32-element types, and per activation block.
pub(crate) const QK: usize = 32;
/// Elements per super-block of the K types.
pub(crate) const QK_K: usize = 256;

// Each type's offsets live with the type (`types/`); the kernels read
// them from here.
pub(crate) use super::types::iq4_nl::{IQ4NL_QS, IQ4_VALUES};
pub(crate) use super::types::iq4_xs::{iq4xs_scale, IQ4XS_QS};
pub(crate) use super::types::q2_k::{q2k_quant, q2k_scale_min, Q2K_D, Q2K_DMIN, Q2K_QS};
pub(crate) use super::types::q3_k::{q3k_quant, q3k_scale, Q3K_D, Q3K_QS, Q3K_SCALES};
pub(crate) use super::types::q4_0::Q4_0_QS;
pub(crate) use super::types::q4_1::{Q4_1_M, Q4_1_QS};
pub(crate) use super::types::q4_k::{q4k_quant, Q4K_DMIN, Q4K_QS, Q4K_SCALES};
pub(crate) use super::types::q5_0::{Q5_0_QH, Q5_0_QS};
pub(crate) use super::types::q5_1::{Q5_1_M, Q5_1_QH, Q5_1_QS};
pub(crate) use super::types::q5_k::{q5k_quant, Q5K_QH, Q5K_QS, Q5K_SCALES};
pub(crate) use super::types::q6_k::{q6k_quant, Q6K_D, Q6K_QH, Q6K_SCALES};
pub(crate) use super::types::q8_0::Q8_0_QS;

/// The little-endian f16 at `bytes[at..at + 2]`, widened.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The little-endian bf16 at `bytes[at..at + 2]`, widened.
#[inline]
pub(crate) fn bf16_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])) << 16)
}

/// Q4_K sub-block `j`'s (scale, min), both 6-bit, from the 12 packed bytes
/// (ggml's `get_scale_min_k4`): sub-blocks 0-3 keep theirs in the low six
/// bits of bytes 0-3 and 4-7; sub-blocks 4-7 combine a nibble of bytes 8-11
/// with the top two bits of bytes 0-7.
#[inline]
pub(crate) fn q4k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q4_0/Q4_1: the 4-bit quant of element `j` (0..32) of the 16 nibble bytes.
#[inline]
pub(crate) fn q4_quant(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    }
}

/// Q5_0/Q5_1: the 5-bit quant of element `j` (0..32): the Q4_0 nibble
/// in `qs` and bit `j` of the little-endian u32 `qh`.
#[inline]
pub(crate) fn q5_quant(qh: u32, qs: &[u8], j: usize) -> u8 {
    q4_quant(qs, j) | ((((qh >> j) & 1) as u8) << 4)
}

/// Where the parts of a 32-element nibble block (Q4_0, Q4_1, Q5_0, Q5_1)
/// sit, all read as `q·d + m`: the types without a stored min have
/// `m = -offset·d`.
#[derive(Clone, Copy)]
pub(crate) struct NibbleBlock {
    pub(crate) bytes: usize,
    /// The f16 min's offset, for Q4_1/Q5_1.
    pub(crate) min: Option<usize>,
    /// The u32 of fifth bits' offset, for Q5_0/Q5_1.
    pub(crate) qh: Option<usize>,
    pub(crate) qs: usize,
    /// `-m/d` of the types without a stored min (8 or 16).
    pub(crate) offset: f32,
}

impl NibbleBlock {
    /// The layout of the type with (`has_min`) a stored min and (`five`)
    /// a fifth bit.
    pub(crate) const fn of(has_min: bool, five: bool) -> NibbleBlock {
        match (has_min, five) {
            (false, false) => NibbleBlock {
                bytes: 18,
                min: None,
                qh: None,
                qs: Q4_0_QS,
                offset: 8.0,
            },
            (true, false) => NibbleBlock {
                bytes: 20,
                min: Some(Q4_1_M),
                qh: None,
                qs: Q4_1_QS,
                offset: 0.0,
            },
            (false, true) => NibbleBlock {
                bytes: 22,
                min: None,
                qh: Some(Q5_0_QH),
                qs: Q5_0_QS,
                offset: 16.0,
            },
            (true, true) => NibbleBlock {
                bytes: 24,
                min: Some(Q5_1_M),
                qh: Some(Q5_1_QH),
                qs: Q5_1_QS,
                offset: 0.0,
            },
        }
    }
}

/// The little-endian u32 at `bytes[at..at + 4]`.
#[inline]
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The little-endian f32 at `bytes[at..at + 4]`.
#[inline]
pub(crate) fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The 2-bit field of element `e` (0..256) in the 64 bytes at `qs` (Q2_K
/// and Q3_K): each 128 elements share 32 bytes, element `32s + l` of them
/// at bits `2s..2s+2` of byte `l`.
#[inline]
pub(crate) fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3
}

/// Per super-block: each sub-block's `d·sc` and `-dmin·m`.
#[inline]
pub(crate) fn q4k_block_scales(d: f32, dmin: f32, scales: &[u8]) -> ([f32; 8], [f32; 8]) {
    let mut scale = [0.0f32; 8];
    let mut min = [0.0f32; 8];
    for j in 0..8 {
        let (sc, m) = q4k_scale_min(scales, j);
        scale[j] = d * f32::from(sc);
        min[j] = -(dmin * f32::from(m));
    }
    (scale, min)
}
