//! Readers every block type shares: little-endian scalars, the nibble
//! and 5-bit quants of the 32-element types, the 2-bit fields of Q2_K and
//! Q3_K, and Q4_K/Q5_K's packed scales. Each type's own layout is in
//! `types/`.

/// Elements per block of the 32-element types, and per activation block.
pub(crate) const QK: usize = 32;
/// Elements per super-block of the K types.
pub(crate) const QK_K: usize = 256;

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
