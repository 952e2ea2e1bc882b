//! Quantizers of Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS: ggml's byte layouts
//! (see `cpu::blocks_k`, `cpu::blocks_iq4`), simple per-sub-block scale
//! choices rather than ggml's error-minimising searches.

use super::encode::{f16_round, inverse, pack_k_scales, push_f16};
use crate::formats::blocks_iq4::IQ4_VALUES;

/// Packs 256 2-bit values as Q2_K/Q3_K store them: element `128h + 32s +
/// l` at bits `2s..2s+2` of byte `32h + l`.
fn push_two_bits(q: &[u8], out: &mut Vec<u8>) {
    for half in q.chunks_exact(128) {
        out.extend(
            (0..32).map(|l| (0..4).fold(0u8, |b, s| b | ((half[32 * s + l] & 3) << (2 * s)))),
        );
    }
}

/// Per sub-block `(scale, min)` with `x ≈ scale · q - min`, `q` in
/// `0..=levels`, `min ≥ 0` (the sub-block's minimum, or 0 if positive).
fn scale_min(sub: &[f32], levels: f32) -> (f32, f32) {
    let min = -sub.iter().copied().fold(0.0f32, f32::min);
    let max = sub.iter().copied().fold(0.0f32, f32::max);
    ((max + min) / levels, min)
}

/// Two-level scales: super-block factors `(d, dmin)` as f16 and per
/// sub-block integers, rounded up so that every sub-block's range stays
/// representable (`scale_bits`/`min_bits` wide).
fn two_level(pairs: &[(f32, f32)], max_int: f32) -> (f32, f32, Vec<u8>, Vec<u8>) {
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

/// Q2_K: 16 sub-blocks of 16, `x ≈ d·sc·q - dmin·m`, 4-bit `sc` and `m`.
pub(super) fn q2_k(block: &[f32], out: &mut Vec<u8>) {
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

/// Q3_K: 16 sub-blocks of 16, `x ≈ d·sc·q` with `q` in -4..4 and 6-bit
/// signed `sc` (stored +32).
pub(super) fn q3_k(block: &[f32], out: &mut Vec<u8>) {
    // The sub-block's largest magnitude maps to q = -4 (its sign in sc).
    let scales: Vec<f32> = block
        .chunks_exact(16)
        .map(|s| {
            let max = s
                .iter()
                .copied()
                .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            max / -4.0
        })
        .collect();
    let d = f16_round(scales.iter().fold(0.0f32, |m, s| m.max(s.abs())) / 31.0);
    let sc: Vec<i8> = scales
        .iter()
        .map(|&s| (s * inverse(d)).round().clamp(-32.0, 31.0) as i8)
        .collect();
    let q: Vec<i8> = block
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let step = d * f32::from(sc[i / 16]);
            (v * inverse(step)).round().clamp(-4.0, 3.0) as i8
        })
        .collect();
    // High-bit mask: bit k of byte l set when element 32k + l has q >= 0.
    let mut hmask = [0u8; 32];
    for (e, &v) in q.iter().enumerate() {
        if v >= 0 {
            hmask[e % 32] |= 1 << (e / 32);
        }
    }
    out.extend_from_slice(&hmask);
    let low: Vec<u8> = q.iter().map(|&v| (v + 4) as u8 & 3).collect();
    push_two_bits(&low, out);
    let stored: Vec<u8> = sc.iter().map(|&s| (s + 32) as u8).collect();
    let mut packed = [0u8; 12];
    for (j, &s) in stored.iter().enumerate() {
        packed[j % 8] |= (s & 0x0F) << (4 * (j / 8));
        packed[8 + j % 4] |= (s >> 4) << (2 * (j / 4));
    }
    out.extend_from_slice(&packed);
    push_f16(out, d);
}

/// Q5_K: as Q4_K (see `super::q4_k`) with 5-bit quants: the fifth bit of
/// element `32k + l` is bit `k` of byte `l` of 32 bytes before the nibbles.
pub(super) fn q5_k(block: &[f32], out: &mut Vec<u8>) {
    let pairs: Vec<_> = block.chunks_exact(32).map(|s| scale_min(s, 31.0)).collect();
    let (d, dmin, sc, m) = two_level(&pairs, 63.0);
    push_f16(out, d);
    push_f16(out, dmin);
    out.extend_from_slice(&pack_k_scales(&sc, &m));
    let q: Vec<u8> = block
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let j = i / 32;
            let offset = dmin * f32::from(m[j]);
            ((v + offset) * inverse(d * f32::from(sc[j])))
                .round()
                .clamp(0.0, 31.0) as u8
        })
        .collect();
    let mut qh = [0u8; 32];
    for (e, &v) in q.iter().enumerate() {
        qh[e % 32] |= (v >> 4) << (e / 32);
    }
    out.extend_from_slice(&qh);
    for group in q.chunks_exact(64) {
        let (lo, hi) = group.split_at(32);
        out.extend(
            lo.iter()
                .zip(hi)
                .map(|(&a, &b)| (a & 0x0F) | ((b & 0x0F) << 4)),
        );
    }
}

/// The IQ4 index nearest `v / dl`.
fn iq4_index(v: f32, dl: f32) -> u8 {
    let x = v * inverse(dl);
    let mut best = 0;
    for (k, t) in IQ4_VALUES.iter().enumerate() {
        if (f32::from(*t) - x).abs() < (f32::from(IQ4_VALUES[best]) - x).abs() {
            best = k;
        }
    }
    best as u8
}

/// The largest magnitude of `sub`, signed, over the table's -127: the
/// scale that maps it to the table's first entry.
fn iq4_scale(sub: &[f32]) -> f32 {
    let max = sub
        .iter()
        .copied()
        .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    max / -127.0
}

/// 32 indices as 16 bytes: element `j` low, `j + 16` high.
fn push_nibbles(sub: &[f32], dl: f32, out: &mut Vec<u8>) {
    let (lo, hi) = sub.split_at(16);
    out.extend(
        lo.iter()
            .zip(hi)
            .map(|(&a, &b)| iq4_index(a, dl) | (iq4_index(b, dl) << 4)),
    );
}

/// IQ4_NL: `x ≈ d · T[q]`.
pub(super) fn iq4_nl(block: &[f32], out: &mut Vec<u8>) {
    let d = f16_round(iq4_scale(block));
    push_f16(out, d);
    push_nibbles(block, d, out);
}

/// IQ4_XS: 8 sub-blocks of 32, `x ≈ d · (ls - 32) · T[q]` with 6-bit `ls`.
pub(super) fn iq4_xs(block: &[f32], out: &mut Vec<u8>) {
    let scales: Vec<f32> = block.chunks_exact(32).map(iq4_scale).collect();
    let d = f16_round(scales.iter().fold(0.0f32, |m, s| m.max(s.abs())) / 31.0);
    let ls: Vec<i8> = scales
        .iter()
        .map(|&s| (s * inverse(d)).round().clamp(-32.0, 31.0) as i8)
        .collect();
    push_f16(out, d);
    let stored: Vec<u8> = ls.iter().map(|&l| (l + 32) as u8).collect();
    let high = stored
        .iter()
        .enumerate()
        .fold(0u16, |h, (j, &s)| h | (u16::from(s >> 4) << (2 * j)));
    out.extend_from_slice(&high.to_le_bytes());
    out.extend(
        stored
            .chunks_exact(2)
            .map(|p| (p[0] & 0x0F) | ((p[1] & 0x0F) << 4)),
    );
    for (sub, &l) in block.chunks_exact(32).zip(&ls) {
        push_nibbles(sub, d * f32::from(l), out);
    }
}
