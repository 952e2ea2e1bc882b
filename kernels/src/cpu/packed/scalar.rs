//! The scalar twin of the group kernels: the numeric contract of the
//! module documentation written out lane by lane. The SIMD kernels must
//! match it bit for bit (same integer sums, same f32 operations in the
//! same order, fused multiply-adds where they fuse).

use super::{has_min, part_offsets, quant_bytes, quant_offset, GROUP_ROWS};
use crate::cpu::blocks::{f16_at, u32_at, QK};
use crate::cpu::quant_act::QRow;
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
    let qb = quant_bytes(dtype);
    let (scales_at, mins_at) = part_offsets(dtype, blocks);
    let offset = quant_offset(dtype);
    for (a, out) in a.iter().zip(out) {
        let mut acc = [0.0f32; GROUP_ROWS];
        for b in 0..blocks {
            let quants = &group[qb * b..qb * (b + 1)];
            let qa = &a.qs[QK * b..QK * (b + 1)];
            let (da, sa) = (a.ds[2 * b], a.ds[2 * b + 1]);
            for (r, acc) in acc.iter_mut().enumerate() {
                let mut isum = -offset * a.sums[b];
                match dtype {
                    DType::Q8_0 => {
                        for w in 0..8 {
                            for e in 0..4 {
                                let u = i32::from(quants[64 * w + 4 * r + e]);
                                isum += u * i32::from(qa[4 * w + e]);
                            }
                        }
                    }
                    _ => {
                        // Q5_0/Q5_1: the fifth bits, 0 for the Q4 types.
                        let qh = if qb > 256 {
                            u32_at(quants, 256 + 4 * r)
                        } else {
                            0
                        };
                        let fifth = |j: usize| i32::from(((qh >> j) & 1) as u8) << 4;
                        for w in 0..4 {
                            for e in 0..4 {
                                let byte = quants[64 * w + 4 * r + e];
                                let (lo, hi) = (4 * w + e, 16 + 4 * w + e);
                                isum += (i32::from(byte & 0x0F) + fifth(lo)) * i32::from(qa[lo]);
                                isum += (i32::from(byte >> 4) + fifth(hi)) * i32::from(qa[hi]);
                            }
                        }
                    }
                }
                let d = f16_at(group, scales_at + 32 * b + 2 * r);
                *acc = (isum as f32).mul_add(d * da, *acc);
                if has_min(dtype) {
                    let m = f16_at(group, mins_at + 32 * b + 2 * r);
                    *acc = m.mul_add(sa, *acc);
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
