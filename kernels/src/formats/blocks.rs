//! ggml's block layouts, byte for byte, and scalar accessors shared by
//! dequantization and the scalar dot products.
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

pub(crate) const Q8_0_QS: usize = 2;
pub(crate) const Q4_0_QS: usize = 2;
pub(crate) const Q4_1_M: usize = 2;
pub(crate) const Q4_1_QS: usize = 4;
pub(crate) const Q5_0_QH: usize = 2;
pub(crate) const Q5_0_QS: usize = 6;
pub(crate) const Q5_1_M: usize = 2;
pub(crate) const Q5_1_QH: usize = 4;
pub(crate) const Q5_1_QS: usize = 8;
pub(crate) const Q4K_DMIN: usize = 2;
pub(crate) const Q4K_SCALES: usize = 4;
pub(crate) const Q4K_QS: usize = 16;
pub(crate) const Q6K_QH: usize = 128;
pub(crate) const Q6K_SCALES: usize = 192;
pub(crate) const Q6K_D: usize = 208;

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

/// Q4_K: the 4-bit quant of element `e` (0..256) of a block. Each 64
/// elements share 32 bytes: the first 32 take the low nibbles, the next 32
/// the high ones.
#[inline]
pub(crate) fn q4k_quant(block: &[u8], e: usize) -> u8 {
    let byte = block[Q4K_QS + 32 * (e / 64) + e % 32];
    if (e % 64) < 32 {
        byte & 0x0F
    } else {
        byte >> 4
    }
}

/// Q6_K: the 6-bit quant (0..64, not yet offset by -32) of element `e`
/// (0..256) and the index of its 16-element scale, as in ggml's
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
