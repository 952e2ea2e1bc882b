//! Weight rows repacked at load, sixteen at a time, for AVX-512 VNNI.
//!
//! A row-at-a-time kernel spends most of its instructions moving one row's
//! scales and nibbles into position and reducing a vector into one output.
//! Here sixteen weight rows are interleaved block by block so that one
//! zmm holds four consecutive quants of each of the sixteen rows: one
//! `vpdpbusd` against four activation bytes broadcast to every lane adds
//! four products to sixteen row sums at once, and the block's result is a
//! vector of sixteen outputs with nothing to reduce.
//!
//! # Layout
//!
//! A matrix of `rows × k` (Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0, `k = 32 ·
//! blocks`) becomes
//! `rows / 16` *groups*; the last `rows % 16` rows (the *tail*) stay in the
//! checkpoint's layout and go through the per-row kernels. A group is, in
//! order, 64-byte aligned and padded to a whole number of 64-byte lines:
//!
//! - quants, `blocks × QB` bytes. For block `b` and 4-byte word `w`, bytes
//!   `QB·b + 64·w + 4·r .. +4` hold row `r`'s four quants of word `w`:
//!   - Q4_0/Q4_1 (`QB = 256`, `w < 4`): row `r`'s nibble bytes `4w..4w+4`
//!     unchanged, so the low nibbles are elements `4w..4w+4` and the high
//!     nibbles elements `16+4w..16+4w+4` (ggml's nibble order);
//!   - Q8_0 (`QB = 512`, `w < 8`): elements `4w..4w+4` as `q + 128`
//!     (unsigned, for `vpdpbusd`'s unsigned operand);
//!   - Q5_0/Q5_1 (`QB = 320`): the nibble words as Q4_0/Q4_1, then at
//!     `QB·b + 256 + 4·r` row `r`'s u32 of fifth bits, unchanged.
//! - scales, `blocks × 32` bytes: block `b`'s sixteen f16 `d`, row order.
//! - Q4_1/Q5_1 only, mins, `blocks × 32` bytes: block `b`'s sixteen f16 `m`.
//!
//! Scales stay f16, as in the checkpoint, so a group streams no more bytes
//! than the rows it replaces (a conversion per block is cheaper than 40%
//! more memory traffic for Q4_1 with f32 scales).
//!
//! # Numeric contract
//!
//! Per output row, per block `b` in order, with the integer sum
//! `isum = Σ q_w · q_a` over the block (the unsigned offset of Q4_0 (8),
//! Q5_0 (16) and Q8_0 (128) taken off exactly as `offset · Σq_a`):
//! `acc = fma(isum as f32, d_w · d_a, acc)`, then for Q4_1/Q5_1
//! `acc = fma(m_w, s_a, acc)`. [`scalar`] computes exactly this, so SIMD and
//! scalar agree bit for bit.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod scalar;

use super::blocks::{NibbleBlock, QK};
use super::isa::CheckedIsa;
use super::quant_act::QRow;
use super::weight_arena::{ArenaBytes, WeightArena, ALIGN};
use super::Isa;
use crate::{DType, WeightView};

/// Weight rows per group: the sixteen i32 lanes of a zmm.
pub(crate) const GROUP_ROWS: usize = 16;
/// Groups are padded to whole cache lines, so that each starts aligned
/// for full-width loads (the arena aligns the first).
const LINE: usize = ALIGN;

/// The groups of a repacked matrix; see the module documentation.
pub(crate) struct PackedRows {
    dtype: DType,
    groups: usize,
    blocks: usize,
    /// Bytes per group, a multiple of [`LINE`].
    group_bytes: usize,
    bytes: ArenaBytes,
}

impl std::fmt::Debug for PackedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedRows")
            .field("dtype", &self.dtype)
            .field("groups", &self.groups)
            .field("blocks", &self.blocks)
            .finish()
    }
}

/// Bytes of one block's quants for the sixteen rows.
const fn quant_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 2 * 256,
        DType::Q5_0 | DType::Q5_1 => 256 + 64,
        _ => 256,
    }
}

/// The types repacked into groups.
const fn is_packed_type(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// Whether `dtype` stores a per-block min (Q4_1, Q5_1).
const fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1)
}

/// Whether matrices of `dtype` are repacked for `isa`: the group kernels
/// exist for AVX-512 VNNI only; other levels keep the per-row kernels.
pub(crate) fn packs(isa: CheckedIsa, dtype: DType) -> bool {
    isa.get() == Isa::Avx512Vnni && is_packed_type(dtype)
}

impl PackedRows {
    /// Repacks the whole groups of `view` into a buffer from `arena`
    /// (`view.dtype` must be Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0; `None`
    /// otherwise or when there is no whole group).
    pub(crate) fn pack(view: &WeightView, arena: &WeightArena) -> Option<PackedRows> {
        let dtype = view.dtype;
        if !is_packed_type(dtype) {
            return None;
        }
        let groups = view.rows / GROUP_ROWS;
        let blocks = view.cols / QK;
        if groups == 0 || blocks == 0 {
            return None;
        }
        let has_min = has_min(dtype);
        let layout = NibbleBlock::of(has_min, matches!(dtype, DType::Q5_0 | DType::Q5_1));
        let qb = quant_bytes(dtype);
        let raw = blocks * (qb + 32 + if has_min { 32 } else { 0 });
        let group_bytes = raw.div_ceil(LINE) * LINE;
        let mut packed = arena.alloc(groups * group_bytes);
        let bytes = packed.as_mut_slice();
        let row_bytes = view.row_bytes();
        let bb = dtype.block_bytes();
        for (g, out) in bytes.chunks_exact_mut(group_bytes).enumerate() {
            let (quants, rest) = out.split_at_mut(blocks * qb);
            let (scales, rest) = rest.split_at_mut(blocks * 32);
            for r in 0..GROUP_ROWS {
                let row = &view.data[(g * GROUP_ROWS + r) * row_bytes..][..row_bytes];
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    scales[32 * b + 2 * r..32 * b + 2 * r + 2].copy_from_slice(&block[..2]);
                    let q = &mut quants[qb * b..qb * (b + 1)];
                    match dtype {
                        DType::Q8_0 => {
                            for w in 0..8 {
                                for e in 0..4 {
                                    q[64 * w + 4 * r + e] = block[2 + 4 * w + e] ^ 0x80;
                                }
                            }
                        }
                        _ => {
                            let qs_at = layout.qs;
                            for w in 0..4 {
                                q[64 * w + 4 * r..64 * w + 4 * r + 4]
                                    .copy_from_slice(&block[qs_at + 4 * w..qs_at + 4 * w + 4]);
                            }
                            if let Some(qh) = layout.qh {
                                q[256 + 4 * r..256 + 4 * r + 4].copy_from_slice(&block[qh..qh + 4]);
                            }
                            if has_min {
                                rest[32 * b + 2 * r..32 * b + 2 * r + 2]
                                    .copy_from_slice(&block[2..4]);
                            }
                        }
                    }
                }
            }
        }
        Some(PackedRows {
            dtype,
            groups,
            blocks,
            group_bytes,
            bytes: packed,
        })
    }

    /// Whole groups; rows `16 · groups..` are the tail.
    pub(crate) fn groups(&self) -> usize {
        self.groups
    }

    /// Rows covered by the groups.
    pub(crate) fn rows(&self) -> usize {
        self.groups * GROUP_ROWS
    }

    /// Bytes of one group.
    pub(crate) fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// Bytes held (for load statistics).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.as_slice().len()
    }

    fn group(&self, g: usize) -> &[u8] {
        &self.bytes.as_slice()[g * self.group_bytes..(g + 1) * self.group_bytes]
    }

    /// The `T` activation rows `a` checked once against this matrix's
    /// width (`32 · blocks` elements each), for the group calls of a tile
    /// walk.
    ///
    /// # Panics
    /// When a row has the wrong length (callers validate shapes; this
    /// guards the SIMD code's loads).
    pub(crate) fn tile<'t, 'a, const T: usize>(
        &self,
        a: &'t [QRow<'a>; T],
    ) -> CheckedTile<'t, 'a, T> {
        let k = self.blocks * QK;
        assert!(
            a.iter().all(|a| a.qs.len() == k
                && a.ds.len() == 2 * self.blocks
                && a.sums.len() == self.blocks),
            "dot_group: activations of the wrong width (want {k})"
        );
        CheckedTile {
            rows: a,
            blocks: self.blocks,
        }
    }

    /// `out[t][r] = W[16·g + r] · a[t]` for group `g` and the activation
    /// rows `a` of `tile`, or with `accumulate` `out[t][r] += …` (one f32
    /// add of the finished sum: a residual connection). `out` points
    /// straight into the destination rows: a stack buffer copied out in
    /// narrower pieces cost store-forwarding stalls (5% of batched decode).
    ///
    /// # Panics
    /// When `g` is not a group or `tile` was checked against a matrix of
    /// another width.
    pub(crate) fn dot_group<const T: usize>(
        &self,
        isa: CheckedIsa,
        g: usize,
        tile: &CheckedTile<'_, '_, T>,
        out: [&mut [f32; GROUP_ROWS]; T],
        accumulate: bool,
    ) {
        assert!(
            g < self.groups && tile.blocks == self.blocks,
            "dot_group: group {g} of {} ({} blocks) against a tile of {} blocks",
            self.groups,
            self.blocks,
            tile.blocks
        );
        let (group, a) = (self.group(g), tile.rows);
        match isa.get() {
            // SAFETY: CheckedIsa guarantees the features; the group holds
            // `blocks` blocks in the layout above and every activation row
            // `blocks` blocks (checked by `tile` and above).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe {
                avx512::dot_group(self.dtype, group, self.blocks, a, out, accumulate)
            },
            _ => scalar::dot_group(self.dtype, group, self.blocks, a, out, accumulate),
        }
    }
}

/// Activation rows whose width [`PackedRows::tile`] checked.
pub(crate) struct CheckedTile<'t, 'a, const T: usize> {
    rows: &'t [QRow<'a>; T],
    blocks: usize,
}

/// Where the parts of a group start: `(scales, mins)` offsets after the
/// quants.
fn part_offsets(dtype: DType, blocks: usize) -> (usize, usize) {
    let scales = blocks * quant_bytes(dtype);
    (scales, scales + blocks * 32)
}

/// The integer offset the unsigned quants carry: `q_stored = q + offset`.
fn quant_offset(dtype: DType) -> i32 {
    match dtype {
        DType::Q8_0 => 128,
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        _ => 0,
    }
}

#[cfg(test)]
mod tests;
