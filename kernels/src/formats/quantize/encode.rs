//! Small encoding steps every quantizer shares (`quantize.rs`, `low_bit.rs`): f16
//! scales as the dequantizer reads them, and Q4_K/Q5_K's packed sub-block scales.

use half::f16;

/// `x` rounded to f16, as the dequantizer will see it.
pub(super) fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

pub(super) fn push_f16(out: &mut Vec<u8>, x: f32) {
    out.extend_from_slice(&f16::from_f32(x).to_le_bytes());
}

pub(super) fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The eight 6-bit scales and mins of Q4_K/Q5_K in their 12 bytes (the
/// inverse of ggml's `get_scale_min_k4`).
pub(super) fn pack_k_scales(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (sc[j], m[j]);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    packed
}
