//! `exp` for softmax and SiLU, sixteen lanes at a time on AVX-512, with a
//! scalar twin that computes the same operations lane by lane (so the two
//! agree bit for bit, and a row's result never depends on which lanes its
//! elements fell into).
//!
//! `e^x = 2^n · e^r` with `n = round(x · log₂e)` and `r = x − n·ln2`
//! (ln2 split in two so that `n · LN2_HI` is exact), `e^r` by its Taylor
//! polynomial of degree 7 on `|r| ≤ ln2/2` (truncation error below
//! `0.347⁸/8! ≈ 5e-9` relative), and `2^n` built in the exponent bits.
//! The input is clamped to `[-87, 88]` so that `2^n` stays a normal f32:
//! `exp(-87) ≈ 1.6e-38` stands in for anything smaller (in a softmax that
//! is zero next to the maximum's 1) and `exp(88) ≈ 1.7e38` for anything
//! larger (SiLU of a very negative input then gives `-0`-ish, as it should).
//! Measured error against f64: see the tests (`EXP_MAX_ULPS`).

use super::isa::CheckedIsa;
#[cfg(any(target_arch = "x86_64", test))]
use super::Isa;

/// The range and polynomial [`exp_scalar`] and its vector twins share.
mod constants {
    pub(super) const MIN_X: f32 = -87.0;
    pub(super) const MAX_X: f32 = 88.0;
    pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// ln 2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits, so `n · LN2_HI`
    /// is exact for |n| ≤ 2⁸.
    pub(super) const LN2_HI: f32 = 0.693_359_4;
    pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
    /// 1/k! for k = 7 down to 2 (the degree-1 and -0 terms are 1).
    pub(super) const TAYLOR: [f32; 6] = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
}
use constants::{LN2_HI, LN2_LO, LOG2E, MAX_X, MIN_X, TAYLOR};

/// `e^x` (see the module documentation for range and accuracy).
#[inline]
// `max` then `min` rather than `clamp`: like `vmaxps`/`vminps` with the
// constant second, they map NaN to a bound instead of passing it on.
#[allow(clippy::manual_clamp)]
pub(crate) fn exp_scalar(x: f32) -> f32 {
    let x = x.max(MIN_X).min(MAX_X);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = TAYLOR[0];
    for c in &TAYLOR[1..] {
        p = p.mul_add(r, *c);
    }
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// [`exp_scalar`] of one value, in a vector lane where the ISA has
/// `exp16`: without FMA enabled at compile time the scalar twin's fused
/// multiply-adds and rounding are library calls (the same results, several
/// times slower), and softmax rescaling calls this once per block.
#[inline]
pub(crate) fn exp_one(isa: CheckedIsa, x: f32) -> f32 {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::exp_one(x) },
        _ => exp_scalar(x),
    }
}

/// The largest of `x`; negative infinity for none. NaN scores do not
/// arise (finite queries and keys), so lane order cannot change the result.
#[inline]
pub(crate) fn max_of(isa: CheckedIsa, x: &[f32]) -> f32 {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::max_of(x) },
        _ => x.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s)),
    }
}

/// `silu(g) = g / (1 + e^-g)`.
#[inline]
pub(crate) fn silu_scalar(g: f32) -> f32 {
    g / (1.0 + exp_scalar(-g))
}

/// `g_i = silu(g_i) · u_i` over the common length.
pub(crate) fn silu_mul(isa: CheckedIsa, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; equal lengths above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::silu_mul(g, u) },
        _ => silu_mul_scalar(g, u),
    }
}

pub(crate) fn silu_mul_scalar(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = silu_scalar(*g) * u;
    }
}

/// `x_i = e^(x_i − shift)` in place; returns `Σ x_i` (the sum's order
/// depends on the ISA, not on the values' positions in memory).
pub(crate) fn exp_shifted(isa: CheckedIsa, x: &mut [f32], shift: f32) -> f32 {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::exp_shifted(x, shift) },
        _ => exp_shifted_scalar(x, shift),
    }
}

pub(crate) fn exp_shifted_scalar(x: &mut [f32], shift: f32) -> f32 {
    let mut sum = 0.0;
    for x in x.iter_mut() {
        *x = exp_scalar(*x - shift);
        sum += *x;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! # Safety
    //! Every function needs AVX-512 F.
    use std::arch::x86_64::*;

    use super::constants::{LN2_HI, LN2_LO, LOG2E, MAX_X, MIN_X, TAYLOR};

    /// Sixteen lanes of [`super::exp_scalar`], operation for operation.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(MIN_X)),
            _mm512_set1_ps(MAX_X),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(TAYLOR[0]);
        for c in &TAYLOR[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let one = _mm512_set1_ps(1.0);
        p = _mm512_fmadd_ps(p, r, one);
        p = _mm512_fmadd_ps(p, r, one);
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(p, _mm512_castsi512_ps(bits))
    }

    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_one(x: f32) -> f32 {
        _mm512_cvtss_f32(exp16(_mm512_set1_ps(x)))
    }

    /// The largest of `x` (negative infinity for none), as a max over
    /// sixteen lanes: max is exact, so the order does not matter.
    ///
    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn max_of(x: &[f32]) -> f32 {
        let n = x.len();
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            let mask = tail_mask(n - i);
            // SAFETY: the mask keeps the load inside `x`.
            let v = unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i)) };
            m = _mm512_mask_max_ps(m, mask, m, v);
            i += 16;
        }
        _mm512_reduce_max_ps(m)
    }

    fn tail_mask(rest: usize) -> __mmask16 {
        ((1u32 << rest.min(16)) - 1) as __mmask16
    }

    /// # Safety
    /// AVX-512 F; `g.len() == u.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        let n = g.len();
        let one = _mm512_set1_ps(1.0);
        let mut i = 0;
        while i < n {
            let mask = tail_mask(n - i);
            // SAFETY: the mask keeps the accesses inside both slices.
            unsafe {
                let p = g.as_mut_ptr().add(i);
                let gv = _mm512_maskz_loadu_ps(mask, p);
                let uv = _mm512_maskz_loadu_ps(mask, u.as_ptr().add(i));
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
                let s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
                _mm512_mask_storeu_ps(p, mask, _mm512_mul_ps(s, uv));
            }
            i += 16;
        }
    }

    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
        let n = x.len();
        let shift = _mm512_set1_ps(shift);
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let mask = tail_mask(n - i);
            // SAFETY: the mask keeps the accesses inside `x`.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, p), shift));
                _mm512_mask_storeu_ps(p, mask, e);
                sum = _mm512_mask_add_ps(sum, mask, sum, e);
            }
            i += 16;
        }
        _mm512_reduce_add_ps(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn exp_one_and_max_of_match_their_scalar_twins() {
        let xs: Vec<f32> = (0..2000).map(|i| (i as f32 - 1000.0) * 0.0917).collect();
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            for &x in &xs {
                assert_eq!(
                    exp_one(isa, x).to_bits(),
                    exp_scalar(x).to_bits(),
                    "{isa:?} {x}"
                );
            }
            for n in [0usize, 1, 15, 16, 17, 32, 33] {
                let part = &xs[500..500 + n];
                let want = part.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
                assert_eq!(max_of(isa, part), want, "{isa:?} {n}");
            }
        }
    }

    /// Largest error of `exp_scalar` against f64 `exp`, in units of the
    /// f32 result's last place, over the clamped range (measured: 0.91 ulp
    /// at most in this test's sweep of 2·10⁶ points; 2 leaves margin).
    const EXP_MAX_ULPS: f64 = 2.0;

    fn ulp(v: f32) -> f64 {
        let v = v.abs();
        f64::from(f32::from_bits(v.to_bits() + 1) - v)
    }

    #[test]
    fn exp_scalar_is_within_ulps_of_f64() {
        let mut worst: f64 = 0.0;
        let steps = 2_000_000;
        for i in 0..=steps {
            let x = MIN_X + (MAX_X - MIN_X) * (i as f32 / steps as f32);
            let got = exp_scalar(x);
            let want = f64::from(x).exp();
            let err = (f64::from(got) - want).abs() / ulp(want as f32);
            worst = worst.max(err);
        }
        assert!(worst <= EXP_MAX_ULPS, "worst error {worst} ulp");
        assert_eq!(exp_scalar(0.0), 1.0);
        // Clamped: tiny but positive, large but finite.
        assert!(exp_scalar(-1e4) > 0.0 && exp_scalar(-1e4) < 1e-37);
        assert!(exp_scalar(f32::NEG_INFINITY) > 0.0);
        assert!(exp_scalar(1e4).is_finite());
        println!("exp: worst error {worst:.2} ulp");
    }

    #[test]
    fn simd_is_bit_identical_to_the_scalar_twin() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            for n in [0usize, 1, 15, 16, 17, 33, 64, 200] {
                // Past the clamp on both sides for silu; the sums stay finite.
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0..100.0)).collect();
                let u: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
                let shift = rng.random_range(-5.0..5.0);
                let scores: Vec<f32> = x.iter().map(|x| x / 4.0).collect();
                let (mut got, mut want) = (scores.clone(), scores);
                let sum = exp_shifted(isa, &mut got, shift);
                let want_sum = exp_shifted_scalar(&mut want, shift);
                assert_eq!(got, want, "{isa:?} n={n}");
                // Sums of positive terms in another order: n · 2⁻²⁴ relative.
                let tol = (n as f32 + 1.0) * f32::EPSILON * want_sum.abs();
                assert!((sum - want_sum).abs() <= tol, "{isa:?} n={n}");
                let (mut got, mut want) = (x.clone(), x.clone());
                silu_mul(isa, &mut got, &u);
                silu_mul_scalar(&mut want, &u);
                assert_eq!(got, want, "{isa:?} n={n}");
            }
            println!("exp and silu bit-identical on {}", isa.get());
        }
    }
}
