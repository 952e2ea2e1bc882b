//! What the Q8_0 LoRA kernels (`lora_q8` and its VNNI twin
//! `lora_q8_vnni`) share: the packed unit's sizes and the two quantized
//! operands, a row of `x` for the shrink and a row's intermediate values
//! for the expand. Their layout is described in `lora_q8`.

use crate::formats::blocks::QK;

/// Rank rows in one unit (the four bytes a `vpdpbusd` lane sums).
pub(crate) const QUAD: usize = 4;
/// Bytes of a unit: four rows × 32 quants, then four f16 scales.
pub(crate) const UNIT: usize = QUAD * QK + 2 * QUAD;

/// One row of `x`, quantized in blocks of 32 (the `quant_act` contract):
/// the quants, and per block `d` and `Σq`. Kept by a task and refilled
/// row after row (no allocation once grown).
#[derive(Default)]
pub(crate) struct QuantRow {
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) sums: Vec<i32>,
    /// Scratch for `quant_act`'s per-half scales and sums, which the
    /// scalar path fills and keeps only the block scales of.
    pub(crate) ds: Vec<f32>,
    pub(crate) halves: Vec<i32>,
}

/// The intermediate values of one row, quantized with one scale (`d =
/// amax / 127`, as `quant_act` does a block). Kept by a task and refilled.
#[derive(Default)]
pub(crate) struct QuantMid {
    pub(crate) d: f32,
    /// Per group of four, its quants as one little-endian word (the
    /// operand a `vpdpbusd` lane takes).
    pub(crate) words: Vec<i32>,
    /// Per group, `-128 · Σq`: what the stored `q + 128` of `Bᵀ` adds to
    /// each lane's integer sum.
    pub(crate) offsets: Vec<i32>,
}

impl QuantMid {
    /// Quantizes `p` (a multiple of four values).
    pub(crate) fn fill(&mut self, p: &[f32]) {
        let amax = p.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        self.d = amax / 127.0;
        let id = if self.d != 0.0 { 1.0 / self.d } else { 0.0 };
        self.words.clear();
        self.offsets.clear();
        for four in p.chunks_exact(QUAD) {
            let q: [i8; QUAD] = std::array::from_fn(|t| round(four[t] * id));
            self.words.push(i32::from_le_bytes(q.map(|q| q as u8)));
            self.offsets
                .push(-128 * q.iter().map(|&q| i32::from(q)).sum::<i32>());
        }
    }

    /// The quant of row `j`.
    pub(crate) fn q(&self, j: usize) -> i8 {
        self.words[j / QUAD].to_le_bytes()[j % QUAD] as i8
    }
}

/// `v` rounded to the nearest integer, ties to even, as i8 (`|v| ≤ 127`
/// here): `cvtss2si` under the default rounding mode, the instruction
/// `round_ties_even` would call a library function for without SSE4.1.
#[inline]
fn round(v: f32) -> i8 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE is part of x86_64.
        unsafe { std::arch::x86_64::_mm_cvtss_si32(std::arch::x86_64::_mm_set_ss(v)) as i8 }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        v.round_ties_even() as i8
    }
}
