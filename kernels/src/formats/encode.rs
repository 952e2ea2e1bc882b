//! Small encoding steps the quantizers of several block types share (see
//! `types/`): f16 scales as the dequantizer reads them, block maxima, the
//! K types' two-level scales and packed sub-block scales.

use half::f16;

/// `x` rounded to f16, as the dequantizer will see it.
pub(crate) fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

pub(crate) fn push_f16(out: &mut Vec<u8>, x: f32) {
    out.extend_from_slice(&f16::from_f32(x).to_le_bytes());
}

pub(crate) fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The eight 6-bit scales and mins of Q4_K/Q5_K in their 12 bytes (the
/// inverse of ggml's `get_scale_min_k4`).
pub(crate) fn pack_k_scales(sc: &[u8], m: &[u8]) -> [u8; 12] {
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

/// The largest magnitude in `block`.
pub(crate) fn amax(block: &[f32]) -> f32 {
    block.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The element of largest magnitude, signed.
pub(crate) fn signed_max(block: &[f32]) -> f32 {
    block
        .iter()
        .copied()
        .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// Packs 256 2-bit values as Q2_K/Q3_K store them: element `128h + 32s +
/// l` at bits `2s..2s+2` of byte `32h + l`.
pub(crate) fn push_two_bits(q: &[u8], out: &mut Vec<u8>) {
    for half in q.chunks_exact(128) {
        out.extend(
            (0..32).map(|l| (0..4).fold(0u8, |b, s| b | ((half[32 * s + l] & 3) << (2 * s)))),
        );
    }
}

/// Per sub-block `(scale, min)` with `x ≈ scale · q - min`, `q` in
/// `0..=levels`, `min ≥ 0` (the sub-block's minimum, or 0 if positive).
pub(crate) fn scale_min(sub: &[f32], levels: f32) -> (f32, f32) {
    let min = -sub.iter().copied().fold(0.0f32, f32::min);
    let max = sub.iter().copied().fold(0.0f32, f32::max);
    ((max + min) / levels, min)
}

/// Two-level scales: super-block factors `(d, dmin)` as f16 and per
/// sub-block integers, rounded up so that every sub-block's range stays
/// representable (`scale_bits`/`min_bits` wide).
pub(crate) fn two_level(pairs: &[(f32, f32)], max_int: f32) -> (f32, f32, Vec<u8>, Vec<u8>) {
    let dmin = f16_round(pairs.iter().map(|p| p.1).fold(0.0, f32::max) / max_int);
    let m: Vec<u8> = pairs
        .iter()
        .map(|p| (p.1 * inverse(dmin)).ceil().clamp(0.0, max_int) as u8)
        .collect();
    let d = f16_round(pairs.iter().map(|p| p.0).fold(0.0, f32::max) / max_int);
    let sc: Vec<u8> = pairs
        .iter()
        .map(|p| (p.0 * inverse(d)).ceil().clamp(0.0, max_int) as u8)
        .collect();
    (d, dmin, sc, m)
}
