//! One block's step of a query's online softmax: the block's largest
//! score, the rescale of what came before when it raises the running
//! maximum, then `e^(s − max)` in place and their sum added to the running
//! sum.
//!
//! Composed of `max_of`, `exp_one` and `exp_shifted`, one call each per
//! query and block. With a head of 64 dimensions a block's scores cost
//! little more than those calls, so for a block of up to 32 scores (every
//! block: `KEY_BLOCK`) AVX-512 runs the same operations in one function,
//! the scores in registers from the first load to the last store: the
//! same lanes, masks and order, so the results are bit for bit the
//! composed ones (tested).

use crate::cpu::exp::{exp_one, exp_shifted, max_of};
use crate::cpu::isa::CheckedIsa;
#[cfg(target_arch = "x86_64")]
use crate::cpu::Isa;

/// Folds `scores` into the running `max` and `sum`: the scores become
/// `e^(s − max)` for the new maximum, and the factor the query's output so
/// far must be scaled by is returned when the block raised the maximum
/// over a non-empty sum.
#[inline]
pub(super) fn online_step(
    isa: CheckedIsa,
    scores: &mut [f32],
    max: &mut f32,
    sum: &mut f32,
) -> Option<f32> {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; the length is checked.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni if scores.len() <= 32 => unsafe {
            x86::online_step(scores, max, sum)
        },
        _ => composed(isa, scores, max, sum),
    }
}

/// [`online_step`] from the three kernels.
fn composed(isa: CheckedIsa, scores: &mut [f32], max: &mut f32, sum: &mut f32) -> Option<f32> {
    let block_max = max_of(isa, scores);
    let mut rescale = None;
    if block_max > *max {
        // The first block finds the sum zero: nothing to rescale.
        if *sum != 0.0 {
            let c = exp_one(isa, *max - block_max);
            *sum *= c;
            rescale = Some(c);
        }
        *max = block_max;
    }
    *sum += exp_shifted(isa, scores, *max);
    rescale
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::exp::x86::exp16;

    fn mask(rest: usize) -> __mmask16 {
        ((1u32 << rest.min(16)) - 1) as __mmask16
    }

    /// # Safety
    /// AVX-512 F; `scores.len() <= 32`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn online_step(
        scores: &mut [f32],
        max: &mut f32,
        sum: &mut f32,
    ) -> Option<f32> {
        let n = scores.len();
        let (m0, m1) = (mask(n), mask(n.saturating_sub(16)));
        let p = scores.as_mut_ptr();
        // SAFETY: the masks keep every access inside `scores` (n <= 32).
        let (v0, v1) = unsafe {
            (
                _mm512_maskz_loadu_ps(m0, p),
                _mm512_maskz_loadu_ps(m1, p.wrapping_add(16)),
            )
        };
        // `max_of`: exact, so one reduction of both halves is the same.
        let lanes = _mm512_set1_ps(f32::NEG_INFINITY);
        let lanes = _mm512_mask_max_ps(lanes, m0, lanes, v0);
        let lanes = _mm512_mask_max_ps(lanes, m1, lanes, v1);
        let block_max = _mm512_reduce_max_ps(lanes);
        let mut rescale = None;
        if block_max > *max {
            if *sum != 0.0 {
                // `exp_one`.
                let c = _mm512_cvtss_f32(exp16(_mm512_set1_ps(*max - block_max)));
                *sum *= c;
                rescale = Some(c);
            }
            *max = block_max;
        }
        // `exp_shifted`: the lanes' sums chunk by chunk, then one reduction.
        let shift = _mm512_set1_ps(*max);
        let e0 = exp16(_mm512_sub_ps(v0, shift));
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(p, m0, e0) };
        let mut lanes = _mm512_mask_add_ps(_mm512_setzero_ps(), m0, _mm512_setzero_ps(), e0);
        if n > 16 {
            let e1 = exp16(_mm512_sub_ps(v1, shift));
            // SAFETY: as above.
            unsafe { _mm512_mask_storeu_ps(p.wrapping_add(16), m1, e1) };
            lanes = _mm512_mask_add_ps(lanes, m1, lanes, e1);
        }
        if n > 0 {
            *sum += _mm512_reduce_add_ps(lanes);
        }
        rescale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_fused_step_is_bit_for_bit_the_composed_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            for n in 0..=33 {
                for (max, sum) in [(f32::NEG_INFINITY, 0.0), (0.5, 3.25), (40.0, 1.0)] {
                    let scores: Vec<f32> = (0..n).map(|_| rng.random_range(-30.0..30.0)).collect();
                    let (mut got, mut want) = (scores.clone(), scores);
                    let (mut got_max, mut got_sum) = (max, sum);
                    let (mut want_max, mut want_sum) = (max, sum);
                    let got_c = online_step(isa, &mut got, &mut got_max, &mut got_sum);
                    let want_c = composed(isa, &mut want, &mut want_max, &mut want_sum);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa:?} n={n}");
                    assert_eq!(got_max.to_bits(), want_max.to_bits(), "{isa:?} n={n}");
                    assert_eq!(got_sum.to_bits(), want_sum.to_bits(), "{isa:?} n={n}");
                    assert_eq!(got_c.map(f32::to_bits), want_c.map(f32::to_bits));
                }
            }
        }
    }
}
