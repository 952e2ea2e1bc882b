//! ggml's layouts of the K types beside Q4_K and Q6_K, byte for byte, and
//! scalar accessors shared by dequantization and the scalar dot products.
//!
//! | type | elements | bytes | layout |
//! |------|----------|-------|--------|
//! | Q2_K | 256 | 84  | 16 B scale/min nibbles, 64 B 2-bit quants, f16 d, f16 dmin |
//! | Q3_K | 256 | 110 | 32 B high bits, 64 B 2-bit quants, 12 B 6-bit scales, f16 d |
//! | Q5_K | 256 | 176 | f16 d, f16 dmin, 12 B scales/mins as Q4_K, 32 B fifth bits, 128 B nibbles |
//!
//! Q2_K and Q3_K have sixteen sub-blocks of 16 elements; Q5_K eight of 32.

pub(crate) const Q2K_QS: usize = 16;
pub(crate) const Q2K_D: usize = 80;
pub(crate) const Q2K_DMIN: usize = 82;
pub(crate) const Q3K_QS: usize = 32;
pub(crate) const Q3K_SCALES: usize = 96;
pub(crate) const Q3K_D: usize = 108;
pub(crate) const Q5K_SCALES: usize = 4;
pub(crate) const Q5K_QH: usize = 16;
pub(crate) const Q5K_QS: usize = 48;

/// The 2-bit field of element `e` (0..256) in the 64 bytes at `qs` (Q2_K
/// and Q3_K): each 128 elements share 32 bytes, element `32s + l` of them
/// at bits `2s..2s+2` of byte `l`.
#[inline]
pub(crate) fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3
}

/// Q2_K: the quant (0..4) of element `e` of a block.
#[inline]
pub(crate) fn q2k_quant(block: &[u8], e: usize) -> u8 {
    two_bits(&block[Q2K_QS..Q2K_QS + 64], e)
}

/// Q2_K sub-block `j`'s (scale, min), both 4-bit: byte `j`'s low and high
/// nibbles.
#[inline]
pub(crate) fn q2k_scale_min(block: &[u8], j: usize) -> (u8, u8) {
    (block[j] & 0x0F, block[j] >> 4)
}

/// Q3_K: the quant (-4..4) of element `e` of a block: the two low bits,
/// less 4 where the element's bit in the high-bit mask (bit `e / 32` of
/// byte `e % 32`) is clear.
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

/// Q3_K sub-block `j`'s scale (-32..32) from the 12 packed bytes: a low
/// nibble of bytes 0-7 (sub-blocks 0-7 the low nibbles, 8-15 the high
/// ones) and two high bits from bytes 8-11, offset by 32.
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

/// Q5_K: the 5-bit quant of element `e` of a block: Q4_K's nibble order,
/// plus bit `e / 32` of fifth-bit byte `e % 32`.
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
