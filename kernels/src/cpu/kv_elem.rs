//! The element types a KV block can hold, and how attention reads them.
//!
//! Attention computes in f32 whatever the storage: a task widens each key
//! block it reads into an L1-sized f32 buffer once and serves every query
//! of its tile from there, so an F16 cache halves the bytes read from
//! memory (what bounds attention at long contexts) for one conversion per
//! block. Widening f16 is exact, so the arithmetic is the f32 kernels' on
//! keys and values rounded to f16 once, when written: that is the whole
//! numeric contract of an F16 cache, and what the NumPy reference does.
//! Q8_0 (`kv_q8`) stores a run in its own layout and widens it to the same
//! f32 layout (`kv_layout`), so attention reads every type alike.

use half::f16;

use super::isa::CheckedIsa;
use super::kv_layout::{key_at, value_at, KEY_BLOCK, KEY_TILE};
#[cfg(target_arch = "x86_64")]
use super::Isa;

/// The storage unit of a KV block.
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Units of one KV head's part of a key block (its run) for `head_dim`:
    /// by default one per element of the f32 layout.
    fn run_len(head_dim: usize) -> usize {
        2 * KEY_BLOCK * head_dim
    }

    /// Stores one position's `key` and `value` (`head_dim` each, the
    /// run's) at `lane` of the key block, rounded to the type. Depends on that
    /// position alone: decode writes one position at a time.
    fn store(run: &mut [Self], lane: usize, key: &[f32], value: &[f32]);

    /// `src` (one run) as f32 in the layout of `kv_layout`: itself for
    /// f32, else widened into `scratch`.
    fn widen<'a>(isa: CheckedIsa, src: &'a [Self], scratch: &'a mut Vec<f32>) -> &'a [f32];

    /// `run` in a type the decode kernels read in place (f32 as it is,
    /// f16 widened as each vector is loaded), in the f32 layout; `None`
    /// for a layout of its own (Q8_0), which [`KvElem::widen`] serves.
    fn direct(run: &[Self]) -> Option<Direct<'_>> {
        let _ = run;
        None
    }
}

/// A run that attention reads without a widened copy (see
/// [`KvElem::direct`]).
#[derive(Clone, Copy)]
pub(crate) enum Direct<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

/// [`KvElem::store`] for types stored element by element in the f32
/// layout, each rounded by `narrow`.
fn store_each<E>(run: &mut [E], lane: usize, key: &[f32], value: &[f32], narrow: fn(f32) -> E) {
    let hd = key.len();
    let tile = key_at(lane, hd);
    for (d, k) in key.iter().enumerate() {
        run[tile + d * KEY_TILE] = narrow(*k);
    }
    let row = value_at(lane, hd);
    for (slot, v) in run[row..row + hd].iter_mut().zip(value) {
        *slot = narrow(*v);
    }
}

impl KvElem for f32 {
    fn store(run: &mut [f32], lane: usize, key: &[f32], value: &[f32]) {
        store_each(run, lane, key, value, |x| x);
    }

    #[inline]
    fn widen<'a>(_: CheckedIsa, src: &'a [f32], _: &'a mut Vec<f32>) -> &'a [f32] {
        src
    }

    fn direct(run: &[f32]) -> Option<Direct<'_>> {
        Some(Direct::F32(run))
    }
}

impl KvElem for f16 {
    /// Round to nearest even, as llama.cpp's `-ctk f16`.
    fn store(run: &mut [f16], lane: usize, key: &[f32], value: &[f32]) {
        store_each(run, lane, key, value, f16::from_f32);
    }

    fn widen<'a>(isa: CheckedIsa, src: &'a [f16], scratch: &'a mut Vec<f32>) -> &'a [f32] {
        scratch.resize(src.len(), 0.0);
        widen_f16(isa, src, scratch);
        scratch
    }

    fn direct(run: &[f16]) -> Option<Direct<'_>> {
        Some(Direct::F16(run))
    }
}

/// `dst[i] = src[i]` as f32 (exact).
pub(crate) fn widen_f16(isa: CheckedIsa, src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    // The vector loops take whole vectors and say how far they got; the
    // scalar loop does the rest.
    let done = match isa.get() {
        // SAFETY: CheckedIsa guarantees the features (AVX2 implies F16C
        // here, see `Isa::is_supported`); equal lengths (cut above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::widen_avx512(src, dst) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::widen_f16c(src, dst) },
        _ => 0,
    };
    widen_scalar(&src[done..], &mut dst[done..]);
}

fn widen_scalar(src: &[f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass slices of equal length and have the named features.
    use std::arch::x86_64::*;

    use half::f16;

    /// Widens the whole vectors of 16; returns how many elements it did.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_avx512(src: &[f16], dst: &mut [f32]) -> usize {
        let whole = src.len() / 16 * 16;
        let (s, d) = (src.as_ptr().cast::<__m256i>(), dst.as_mut_ptr());
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= len for both slices.
            unsafe {
                let h = _mm256_loadu_si256(s.cast::<u16>().add(i).cast());
                _mm512_storeu_ps(d.add(i), _mm512_cvtph_ps(h));
            }
        }
        whole
    }

    /// Widens the whole vectors of 8; returns how many elements it did.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) -> usize {
        let whole = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr().cast::<u16>(), dst.as_mut_ptr());
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= len for both slices.
            unsafe {
                let h = _mm_loadu_si128(s.add(i).cast());
                _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
            }
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;

    #[test]
    fn widening_is_exact_on_every_isa() {
        let src: Vec<f16> = (0..77)
            .map(|i| f16::from_f32((i as f32 - 30.0) * 0.37))
            .chain([f16::INFINITY, f16::MIN_POSITIVE_SUBNORMAL, f16::MAX])
            .collect();
        let want: Vec<f32> = src.iter().map(|h| h.to_f32()).collect();
        for isa in Isa::supported() {
            let mut got = vec![0.0; src.len()];
            widen_f16(CheckedIsa::at_most(isa), &src, &mut got);
            assert_eq!(got, want, "{isa}");
        }
    }

    #[test]
    fn storing_rounds_to_nearest_even() {
        // 1 + 2⁻¹¹ lies halfway between f16 1.0 and 1 + 2⁻¹⁰: even is 1.0.
        let mut run = vec![f16::ZERO; f16::run_len(1)];
        let (tie, above) = (1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11));
        f16::store(&mut run, 17, &[tie], &[above]);
        assert_eq!(run[key_at(17, 1)].to_f32(), 1.0);
        assert_eq!(run[value_at(17, 1)].to_f32(), 1.0 + 2f32.powi(-9));
    }
}
