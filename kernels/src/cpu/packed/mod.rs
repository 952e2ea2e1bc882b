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
//! A matrix of `rows × k` becomes `rows / 16` *groups*; the last `rows %
//! 16` rows (the *tail*) stay in the checkpoint's layout and go through the
//! per-row kernels. A group is one stream of *units*, each 64-byte aligned
//! and padded to whole 64-byte lines, so that decode reads it front to
//! back as one sequential stream (quants and scales in separate arrays
//! made three streams per group, which the hardware prefetchers followed
//! badly at one activation row). A unit holds one or two of the type's
//! blocks ([`Layout`]): their quants, then per block its *parts* (scales,
//! mins). For block `b` and 4-byte word `w` of 32 elements, quant bytes
//! `64·w + 4·r .. +4` hold row `r`'s four quants of word `w`:
//!
//! - Q4_0/Q4_1 (256 quant bytes, `w < 4`): row `r`'s nibble bytes `4w..4w+4`
//!   unchanged, so the low nibbles are elements `4w..4w+4` and the high
//!   nibbles elements `16+4w..16+4w+4` (ggml's nibble order);
//! - Q8_0 (512 bytes, `w < 8`): elements `4w..4w+4` as `q + 128` (unsigned,
//!   for `vpdpbusd`'s unsigned operand);
//! - IQ4_NL (256): as Q4_0 (the kernels look each nibble up as `T[q] + 128`);
//! - Q5_0/Q5_1 (320): the nibble words as Q4_0/Q4_1, then 64 bytes of
//!   fifth bits: bit `c` of byte `256 + 4·r + e` is row `r`'s element `4c +
//!   e` (so one shift and mask per word places them; ggml's u32 per row
//!   took a multiply per word to spread);
//! - Q4_K (a 256-element block, 2,048 bytes): pair `p` of 32-element
//!   sub-blocks at `512·p`, word `w < 8` of it holding row `r`'s nibble
//!   bytes `32p + 4w .. +4`: low nibbles are sub-block `2p`'s elements
//!   `4w..4w+4`, high nibbles sub-block `2p+1`'s (ggml's order);
//! - Q6_K (256 elements, 4,096 bytes): 32-element block `j` at `512·j` as
//!   Q8_0's words, each quant the unsigned 6-bit `q` (0..64, value `q -
//!   32`): a byte per quant, a third more than ggml's 6.5 bits, for a
//!   kernel without bit shuffling (these are a few small matrices).
//!
//! The parts, per block, sixteen rows each in row order:
//! - the 32-element types: f16 `d` (32 bytes), then for Q4_1/Q5_1 f16 `m`;
//! - Q4_K: f16 `d`, f16 `dmin`, then the 6-bit scales as bytes (sub-block
//!   `j`'s at `64 + 16·j`) and mins (at `192 + 16·j`);
//! - Q6_K: f16 `d`, then the i8 scale of 16-element sub-block `h` at
//!   `32 + 16·h`.
//!
//! Scales stay f16, as in the checkpoint, so a group streams about the
//! bytes of the rows it replaces (a conversion per block is cheaper than
//! more memory traffic).
//!
//! # Numeric contract
//!
//! Per output row, per 32-element activation block `b` in order, with the
//! integer sum `isum = Σ q_w · q_a` over the block (the unsigned offset of
//! Q4_0 (8), Q5_0 (16), IQ4_NL and Q8_0 (128) taken off exactly as `offset
//! · Σq_a`): `acc = fma(isum as f32, d_w · d_a, acc)`, then for Q4_1/Q5_1
//! `acc = fma(m_w, s_a, acc)`. Q4_K takes `d_w = d · sc` and then `acc =
//! fma(-(dmin · m), s_a, acc)` (both products exact in f32); Q6_K folds its
//! two 16-element scales into the integer sum, `isum = sc₀ · (Σ₀ q·q_a - 32
//! Σ₀ q_a) + sc₁ · (Σ₁ …)`, with `d_w = d`. [`scalar`] computes exactly
//! this, so SIMD and scalar agree bit for bit.

#[cfg(target_arch = "x86_64")]
/// Runs `$body` with `$t` bound to each literal `0..T` (`T <= 16`). The
/// copies carry constant indices, so the per-row accumulators stay in
/// registers; a `for t in 0..T` loop this large is not unrolled by LLVM
/// and spills them to the stack on every block.
macro_rules! for_each_row {
    ($T:ident, $t:ident, $body:block) => {
        for_each_row!(@ $T, $t, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $T:ident, $t:ident, $body:block, $($n:literal)*) => {
        const { assert!($T <= 16, "group kernels take at most 16 activation rows") };
        $( if $n < $T { let $t: usize = $n; $body } )*
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
mod layout;
mod pack;
pub(crate) mod scalar;

use super::isa::CheckedIsa;
use super::quant_act::QRow;
use super::weight_arena::{ArenaBytes, WeightArena};
use super::Isa;
use crate::formats::blocks::QK;
use crate::{DType, WeightView};
pub(crate) use layout::GROUP_ROWS;
use layout::{is_packed_type, Layout};

/// The groups of a repacked matrix; see the module documentation.
pub(crate) struct PackedRows {
    dtype: DType,
    groups: usize,
    /// Blocks of the type per row (`k / layout.elems`).
    blocks: usize,
    /// Bytes per group, a multiple of [`layout::LINE`].
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

/// Whether matrices of `dtype` are repacked for `isa`: the group kernels
/// exist for AVX-512 VNNI only; other levels keep the per-row kernels.
pub(crate) fn packs(isa: CheckedIsa, dtype: DType) -> bool {
    isa.get() == Isa::Avx512Vnni && is_packed_type(dtype)
}

impl PackedRows {
    /// Repacks the whole groups of `view` into a buffer from `arena`
    /// (`None` for a type without group kernels or when there is no whole
    /// group).
    pub(crate) fn pack(view: &WeightView, arena: &WeightArena) -> Option<PackedRows> {
        let dtype = view.dtype;
        if !is_packed_type(dtype) {
            return None;
        }
        let layout = Layout::of(dtype);
        let groups = view.rows / GROUP_ROWS;
        let blocks = view.cols / layout.elems;
        if groups == 0 || blocks == 0 || !view.cols.is_multiple_of(layout.elems) {
            return None;
        }
        let group_bytes = layout.group_bytes(blocks);
        let mut packed = arena.alloc(groups * group_bytes);
        let row_bytes = view.row_bytes();
        for (g, out) in packed
            .as_mut_slice()
            .chunks_exact_mut(group_bytes)
            .enumerate()
        {
            let rows = &view.data[g * GROUP_ROWS * row_bytes..][..GROUP_ROWS * row_bytes];
            pack::group(dtype, layout, rows, row_bytes, out);
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

    fn group(&self, g: usize) -> &[u8] {
        &self.bytes.as_slice()[g * self.group_bytes..(g + 1) * self.group_bytes]
    }

    /// Whether whole tiles of [`amx::AMX_ROWS`] activation rows go
    /// through AMX for this matrix ([`PackedRows::with_amx_group`]).
    pub(crate) fn takes_amx(&self, isa: CheckedIsa) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let k = self.blocks * Layout::of(self.dtype).elems;
            isa.get() == Isa::Avx512Vnni
                && amx::takes(self.dtype, k)
                && crate::cpu::amx::int8_available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            false
        }
    }

    /// Group `g` unpacked for AMX, lent to `f`; `None` when
    /// [`PackedRows::takes_amx`] is false or this thread's scratch is
    /// lent already.
    ///
    /// # Panics
    /// When `g` is not a group.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn with_amx_group<R>(
        &self,
        isa: CheckedIsa,
        g: usize,
        f: impl FnOnce(&amx::Unpacked) -> R,
    ) -> Option<R> {
        if !self.takes_amx(isa) {
            return None;
        }
        // SAFETY: AMX-INT8 was granted and `isa` checked AVX-512 VNNI
        // (`takes_amx`); the group holds `blocks` blocks of the type.
        unsafe { amx::with_group(self.dtype, self.group(g), self.blocks, f) }
    }

    /// Whether [`PackedRows::dot_group_amx`] takes `rows` against `u`.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn amx_fits(&self, u: &amx::Unpacked, rows: &amx::AmxRows) -> bool {
        u.blocks() * QK == self.blocks * Layout::of(self.dtype).elems && u.fits(rows)
    }

    /// [`PackedRows::dot_group`] for a whole AMX tile of activation rows
    /// against a group `u` from [`PackedRows::with_amx_group`].
    ///
    /// # Panics
    /// When [`PackedRows::amx_fits`] is false (callers check it; where it
    /// is false, `dot_group` takes the rows).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn dot_group_amx(
        &self,
        u: &amx::Unpacked,
        rows: &amx::AmxRows,
        out: [&mut [f32; GROUP_ROWS]; amx::AMX_ROWS],
        accumulate: bool,
    ) {
        assert!(
            self.amx_fits(u, rows),
            "dot_group_amx: rows or group of another width"
        );
        // SAFETY: `u` came from `with_amx_group` (AMX granted, AVX-512
        // VNNI checked); the widths are checked above.
        unsafe { u.dot(rows, out, accumulate) }
    }

    /// The `T` activation rows `a` checked once against this matrix's
    /// width, for the group calls of a tile walk.
    ///
    /// # Panics
    /// When a row has the wrong length (callers validate shapes; this
    /// guards the SIMD code's loads).
    pub(crate) fn tile<'t, 'a, const T: usize>(
        &self,
        a: &'t [QRow<'a>; T],
    ) -> CheckedTile<'t, 'a, T> {
        let k = self.blocks * Layout::of(self.dtype).elems;
        let act_blocks = k / QK;
        assert!(
            a.iter().all(|a| a.qs.len() == k
                && a.ds.len() == 2 * act_blocks
                && a.sums.len() == act_blocks
                && a.half_sums.len() == 2 * act_blocks),
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
                match self.dtype {
                    DType::Q4K => avx512_k::dot_q4k(group, self.blocks, a, out, accumulate),
                    DType::Q6K => avx512_k::dot_q6k(group, self.blocks, a, out, accumulate),
                    dtype => avx512::dot_group(dtype, group, self.blocks, a, out, accumulate),
                }
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

#[cfg(all(test, target_arch = "x86_64"))]
mod amx_tests;
#[cfg(test)]
mod tests;
