//! How the blocks of one group of sixteen rows lie in a packed matrix (see
//! the module documentation of `packed`), and the per-type facts the
//! packer and every group kernel read.

use crate::cpu::weight_arena::ALIGN;
use crate::formats::blocks::QK;
use crate::DType;

/// Weight rows per group: the sixteen i32 lanes of a zmm.
pub(crate) const GROUP_ROWS: usize = 16;
/// Units are padded to whole cache lines, so that each starts aligned
/// for full-width loads (the arena aligns the first).
pub(crate) const LINE: usize = ALIGN;

/// Where the blocks of a group lie (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Elements per block: 32, or 256 for the K types.
    pub(crate) elems: usize,
    /// Quant bytes of one block (sixteen rows), a multiple of [`LINE`].
    pub(crate) qb: usize,
    /// Bytes of one block's parts (scales, mins).
    pub(crate) pb: usize,
    /// Blocks per unit: two where one block's bytes are not whole lines.
    pub(crate) per_unit: usize,
    pub(crate) unit_bytes: usize,
}

impl Layout {
    pub(crate) const fn of(dtype: DType) -> Layout {
        let (elems, qb, pb) = match dtype {
            DType::Q8_0 => (QK, 512, 32),
            DType::Q5_0 => (QK, 320, 32),
            DType::Q5_1 => (QK, 320, 64),
            DType::Q4_1 => (QK, 256, 64),
            DType::Q4K => (256, 2048, 64 + 256),
            DType::Q6K => (256, 4096, 32 + 256),
            // Q4_0, IQ4_NL.
            _ => (QK, 256, 32),
        };
        let per_unit = if (qb + pb) % LINE == 0 { 1 } else { 2 };
        let unit_bytes = (per_unit * (qb + pb)).div_ceil(LINE) * LINE;
        Layout {
            elems,
            qb,
            pb,
            per_unit,
            unit_bytes,
        }
    }

    /// Offsets in a group of block `b`'s quants and parts.
    #[inline(always)]
    pub(crate) fn block(&self, b: usize) -> (usize, usize) {
        let (unit, i) = (b / self.per_unit, b % self.per_unit);
        let base = unit * self.unit_bytes;
        (
            base + i * self.qb,
            base + self.per_unit * self.qb + i * self.pb,
        )
    }

    /// Bytes of a group of `blocks` blocks (the last unit padded whole).
    pub(crate) fn group_bytes(&self, blocks: usize) -> usize {
        blocks.div_ceil(self.per_unit) * self.unit_bytes
    }
}

/// The types repacked into groups.
pub(super) const fn is_packed_type(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::IQ4NL
            | DType::Q4K
            | DType::Q6K
    )
}

/// Whether `dtype` stores a per-block min (Q4_1, Q5_1).
pub(crate) const fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1)
}

/// The integer offset the unsigned quants carry: `q_stored = q + offset`.
pub(crate) fn quant_offset(dtype: DType) -> i32 {
    match dtype {
        DType::Q8_0 => 128,
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        DType::IQ4NL => 128,
        // Q6_K's 32 is taken off per 16-element half (see `scalar::q6k`).
        _ => 0,
    }
}
