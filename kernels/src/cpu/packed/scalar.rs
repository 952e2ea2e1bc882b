//! The scalar twin of the group kernels: the numeric contract of the
//! module documentation written out lane by lane. The SIMD kernels must
//! match it bit for bit (same integer sums, same f32 operations in the
//! same order, fused multiply-adds where they fuse).

use super::layout::{has_min, quant_offset, Layout, GROUP_ROWS};
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::IQ4_VALUES;
use crate::formats::blocks::{f16_at, QK};
use crate::DType;

/// See [`super::PackedRows::dot_group`]; `group` holds `blocks` blocks.
pub(crate) fn dot_group<const T: usize>(
    dtype: DType,
    group: &[u8],
    blocks: usize,
    a: &[QRow<'_>; T],
    out: [&mut [f32; GROUP_ROWS]; T],
    accumulate: bool,
) {
    let layout = Layout::of(dtype);
    for (a, out) in a.iter().zip(out) {
        let mut acc = [0.0f32; GROUP_ROWS];
        for b in 0..blocks {
            let (q_at, p_at) = layout.block(b);
            let quants = &group[q_at..q_at + layout.qb];
            let parts = &group[p_at..p_at + layout.pb];
            for (r, acc) in acc.iter_mut().enumerate() {
                match dtype {
                    DType::Q4K => q4k(quants, parts, r, a, b, acc),
                    DType::Q6K => q6k(quants, parts, r, a, b, acc),
                    _ => small(dtype, quants, parts, r, a, b, acc),
                }
            }
        }
        if accumulate {
            out.iter_mut().zip(acc).for_each(|(o, a)| *o += a);
        } else {
            *out = acc;
        }
    }
}

/// `Σ u · q_a` over word-major quants `quants` (`64·w + 4·r + e`) of row
/// `r`, words `words` against activation elements `4w..4w+4` of `qa`.
fn word_sum(quants: &[u8], r: usize, qa: &[i8], words: std::ops::Range<usize>) -> i32 {
    let mut isum = 0;
    for w in words {
        for e in 0..4 {
            isum += i32::from(quants[64 * w + 4 * r + e]) * i32::from(qa[4 * w + e]);
        }
    }
    isum
}

/// One 32-element block `b` of the 32-element types for row `r`.
fn small(
    dtype: DType,
    quants: &[u8],
    parts: &[u8],
    r: usize,
    a: &QRow<'_>,
    b: usize,
    acc: &mut f32,
) {
    let qa = &a.qs[QK * b..QK * (b + 1)];
    let (da, sa) = (a.ds[2 * b], a.ds[2 * b + 1]);
    let mut isum = -quant_offset(dtype) * a.sums[b];
    if dtype == DType::Q8_0 {
        isum += word_sum(quants, r, qa, 0..8);
    } else {
        // Q5_0/Q5_1: element j's fifth bit is bit j / 4 of byte 4r + j % 4
        // after the nibbles; none for the Q4 types.
        let five = quants.len() > 256;
        let fifth = |j: usize| {
            if five {
                i32::from((quants[256 + 4 * r + j % 4] >> (j / 4)) & 1) << 4
            } else {
                0
            }
        };
        // IQ4_NL's nibbles stand for `T[q] + 128`.
        let unsigned = |nibble: u8| match dtype {
            DType::IQ4NL => i32::from(IQ4_VALUES[usize::from(nibble)]) + 128,
            _ => i32::from(nibble),
        };
        for w in 0..4 {
            for e in 0..4 {
                let byte = quants[64 * w + 4 * r + e];
                let (lo, hi) = (4 * w + e, 16 + 4 * w + e);
                isum += (unsigned(byte & 0x0F) + fifth(lo)) * i32::from(qa[lo]);
                isum += (unsigned(byte >> 4) + fifth(hi)) * i32::from(qa[hi]);
            }
        }
    }
    let d = f16_at(parts, 2 * r);
    *acc = (isum as f32).mul_add(d * da, *acc);
    if has_min(dtype) {
        let m = f16_at(parts, 32 + 2 * r);
        *acc = m.mul_add(sa, *acc);
    }
}

/// One Q4_K block (eight activation blocks from `8·b`) for row `r`.
fn q4k(quants: &[u8], parts: &[u8], r: usize, a: &QRow<'_>, b: usize, acc: &mut f32) {
    let (d, dmin) = (f16_at(parts, 2 * r), f16_at(parts, 32 + 2 * r));
    for j in 0..8 {
        let ab = 8 * b + j;
        let qa = &a.qs[QK * ab..QK * (ab + 1)];
        let (da, sa) = (a.ds[2 * ab], a.ds[2 * ab + 1]);
        let pair = &quants[512 * (j / 2)..512 * (j / 2 + 1)];
        let shift = 4 * (j % 2);
        let mut isum = 0;
        for w in 0..8 {
            for e in 0..4 {
                let q = (pair[64 * w + 4 * r + e] >> shift) & 0x0F;
                isum += i32::from(q) * i32::from(qa[4 * w + e]);
            }
        }
        let scale = d * f32::from(parts[64 + 16 * j + r]);
        let min = dmin * f32::from(parts[192 + 16 * j + r]);
        *acc = (isum as f32).mul_add(scale * da, *acc);
        *acc = (-min).mul_add(sa, *acc);
    }
}

/// One Q6_K block (eight activation blocks from `8·b`) for row `r`.
fn q6k(quants: &[u8], parts: &[u8], r: usize, a: &QRow<'_>, b: usize, acc: &mut f32) {
    let d = f16_at(parts, 2 * r);
    for j in 0..8 {
        let ab = 8 * b + j;
        let qa = &a.qs[QK * ab..QK * (ab + 1)];
        let da = a.ds[2 * ab];
        let words = &quants[512 * j..512 * (j + 1)];
        let half = |h: usize| {
            let sc = i32::from(parts[32 + 16 * (2 * j + h) + r] as i8);
            let sum = word_sum(words, r, qa, 4 * h..4 * h + 4) - 32 * a.half_sums[2 * ab + h];
            sc * sum
        };
        let isum = half(0) + half(1);
        *acc = (isum as f32).mul_add(d * da, *acc);
    }
}
