//! The block layouts as the kernels read them: every type's offsets and
//! accessors (from `types/`) and the shared readers (from `read`) in one
//! place, and the views the kernels build on them (nibble blocks, Q4_K's
//! per-sub-block scales).
//!
//! | type | elements | bytes | layout |
//! |------|----------|-------|--------|
//! | Q8_0 | 32  | 34  | f16 d, 32 × i8 |
//! | Q4_0 | 32  | 18  | f16 d, 16 B nibbles (element j low, j+16 high), value (q-8)·d |
//! | Q4_1 | 32  | 20  | f16 d, f16 m, 16 B nibbles, value q·d + m |
//! | Q4_K | 256 | 144 | f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles |
//! | Q6_K | 256 | 210 | 128 B low nibbles, 64 B high 2-bit pairs, 16 × i8 scales, f16 d |
//! | Q5_0 | 32  | 22  | f16 d, u32 fifth bits (bit j: element j), 16 B nibbles as Q4_0, value (q-16)·d |
//! | Q5_1 | 32  | 24  | f16 d, f16 m, u32 fifth bits, 16 B nibbles, value q·d + m |

// Each type's offsets live with the type (`types/`), the shared readers
// in `read`; the kernels read both from here.
pub(crate) use super::read::{bf16_at, f16_at, f32_at, q4_quant, q4k_scale_min, u32_at, QK, QK_K};
pub(crate) use super::types::iq4_nl::{IQ4NL_QS, IQ4_VALUES};
pub(crate) use super::types::iq4_xs::{iq4xs_scale, IQ4XS_QS};
pub(crate) use super::types::q2_k::{q2k_quant, q2k_scale_min, Q2K_D, Q2K_DMIN, Q2K_QS};
pub(crate) use super::types::q3_k::{q3k_quant, q3k_scale, Q3K_D, Q3K_QS, Q3K_SCALES};
pub(crate) use super::types::q4_0::Q4_0_QS;
pub(crate) use super::types::q4_1::{Q4_1_M, Q4_1_QS};
pub(crate) use super::types::q4_k::{q4k_quant, Q4K_DMIN, Q4K_QS, Q4K_SCALES};
pub(crate) use super::types::q5_0::{Q5_0_QH, Q5_0_QS};
pub(crate) use super::types::q5_1::{Q5_1_M, Q5_1_QH, Q5_1_QS};
pub(crate) use super::types::q5_k::{q5k_quant, Q5K_QH, Q5K_QS, Q5K_SCALES};
pub(crate) use super::types::q6_k::{q6k_quant, Q6K_D, Q6K_QH, Q6K_SCALES};
pub(crate) use super::types::q8_0::Q8_0_QS;

/// Where the parts of a 32-element nibble block (Q4_0, Q4_1, Q5_0, Q5_1)
/// sit, all read as `q·d + m`: the types without a stored min have
/// `m = -offset·d`.
#[derive(Clone, Copy)]
pub(crate) struct NibbleBlock {
    pub(crate) bytes: usize,
    /// The f16 min's offset, for Q4_1/Q5_1.
    pub(crate) min: Option<usize>,
    /// The u32 of fifth bits' offset, for Q5_0/Q5_1.
    pub(crate) qh: Option<usize>,
    pub(crate) qs: usize,
    /// `-m/d` of the types without a stored min (8 or 16).
    pub(crate) offset: f32,
}

impl NibbleBlock {
    /// The layout of the type with (`has_min`) a stored min and (`five`)
    /// a fifth bit.
    pub(crate) const fn of(has_min: bool, five: bool) -> NibbleBlock {
        match (has_min, five) {
            (false, false) => NibbleBlock {
                bytes: 18,
                min: None,
                qh: None,
                qs: Q4_0_QS,
                offset: 8.0,
            },
            (true, false) => NibbleBlock {
                bytes: 20,
                min: Some(Q4_1_M),
                qh: None,
                qs: Q4_1_QS,
                offset: 0.0,
            },
            (false, true) => NibbleBlock {
                bytes: 22,
                min: None,
                qh: Some(Q5_0_QH),
                qs: Q5_0_QS,
                offset: 16.0,
            },
            (true, true) => NibbleBlock {
                bytes: 24,
                min: Some(Q5_1_M),
                qh: Some(Q5_1_QH),
                qs: Q5_1_QS,
                offset: 0.0,
            },
        }
    }
}

/// Per super-block: each sub-block's `d·sc` and `-dmin·m`.
#[inline]
pub(crate) fn q4k_block_scales(d: f32, dmin: f32, scales: &[u8]) -> ([f32; 8], [f32; 8]) {
    let mut scale = [0.0f32; 8];
    let mut min = [0.0f32; 8];
    for j in 0..8 {
        let (sc, m) = q4k_scale_min(scales, j);
        scale[j] = d * f32::from(sc);
        min[j] = -(dmin * f32::from(m));
    }
    (scale, min)
}
