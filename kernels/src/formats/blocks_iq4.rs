//! ggml's IQ4 layouts, byte for byte: 4-bit indices into one fixed
//! non-linear table of sixteen i8 values.
//!
//! | type | elements | bytes | layout |
//! |------|----------|-------|--------|
//! | IQ4_NL | 32  | 18  | f16 d, 16 B index nibbles (element j low, j+16 high), value d·T[q] |
//! | IQ4_XS | 256 | 136 | f16 d, u16 high scale bits, 4 B low scale nibbles, 128 B index nibbles |
//!
//! IQ4_XS has eight sub-blocks of 32, each with a 6-bit scale `ls` (value
//! `d·(ls-32)·T[q]`) and 16 bytes of nibbles in IQ4_NL's order.

/// ggml's `kvalues_iq4nl`.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub(crate) const IQ4NL_QS: usize = 2;
pub(crate) const IQ4XS_SCALES_H: usize = 2;
pub(crate) const IQ4XS_SCALES_L: usize = 4;
pub(crate) const IQ4XS_QS: usize = 8;

/// IQ4_XS sub-block `j`'s scale less 32 (-32..32): the nibble `j % 2` of
/// low-scale byte `j / 2`, and bits `2j..2j+2` of the u16 of high bits.
#[inline]
pub(crate) fn iq4xs_scale(block: &[u8], j: usize) -> i8 {
    let low = (block[IQ4XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F;
    let high_bits = u16::from_le_bytes([block[IQ4XS_SCALES_H], block[IQ4XS_SCALES_H + 1]]);
    let high = ((high_bits >> (2 * j)) & 3) as u8;
    (low | (high << 4)) as i8 - 32
}
