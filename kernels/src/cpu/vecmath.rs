//! f32 vector primitives for attention: `a · b` and `y += α·x`.

use super::isa::CheckedIsa;
use super::Isa;

/// `Σ a_i b_i` over the common length.
pub(crate) fn dot(isa: CheckedIsa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa.get() {
        Isa::Scalar => dot_scalar(a, b),
        // SAFETY: CheckedIsa guarantees the features; equal lengths above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_avx2(a, b) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::dot_avx512(a, b) },
        // NEON and other architectures' levels: the scalar code.
        _ => dot_scalar(a, b),
    }
}

/// `y_i += alpha · x_i` over the common length.
pub(crate) fn axpy(isa: CheckedIsa, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    match isa.get() {
        Isa::Scalar => axpy_scalar(alpha, x, y),
        // SAFETY: CheckedIsa guarantees the features; equal lengths above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::axpy_avx2(alpha, x, y) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::axpy_avx512(alpha, x, y) },
        // NEON and other architectures' levels: the scalar code.
        _ => axpy_scalar(alpha, x, y),
    }
}

pub(crate) fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

pub(crate) fn axpy_scalar(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass slices of equal length and have the named features.
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
            i += 16;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            i += 8;
        }
        let v = _mm256_add_ps(acc0, acc1);
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let mut sum = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
        for j in i..n {
            sum += a[j] * b[j];
        }
        sum
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)),
            );
            i += 8;
        }
        for j in i..n {
            y[j] += alpha * x[j];
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        while i + 32 <= n {
            acc0 = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i)),
                _mm512_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i + 16)),
                _mm512_loadu_ps(b.as_ptr().add(i + 16)),
                acc1,
            );
            i += 32;
        }
        if i < n {
            // A masked load reads only the remaining elements.
            let rest = (n - i).min(16);
            let mask: __mmask16 = ((1u32 << rest) - 1) as __mmask16;
            acc0 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, a.as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, b.as_ptr().add(i)),
                acc0,
            );
            i += rest;
        }
        if i < n {
            let mask: __mmask16 = ((1u32 << (n - i)) - 1) as __mmask16;
            acc1 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, a.as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, b.as_ptr().add(i)),
                acc1,
            );
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy_avx512(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let va = _mm512_set1_ps(alpha);
        let mut i = 0;
        while i < n {
            let rest = (n - i).min(16);
            let mask: __mmask16 = ((1u32 << rest) - 1) as __mmask16;
            let p = y.as_mut_ptr().add(i);
            let sum = _mm512_fmadd_ps(
                va,
                _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, p),
            );
            _mm512_mask_storeu_ps(p, mask, sum);
            i += rest;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Sums of up to ~200 products of values in ±1, reordered: the rounding
    /// error of either order is ≤ n·2⁻²⁴·Σ|a_i b_i|; 1e-5 of the magnitude
    /// covers n ≤ 160 with margin, and these tests use |a b| ≤ 1.
    const F32_REORDER_TOL: f32 = 1e-5;

    #[test]
    fn simd_matches_scalar() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            for n in [0usize, 1, 7, 15, 16, 17, 31, 33, 64, 100, 129] {
                let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                let magnitude: f32 = a.iter().zip(&b).map(|(a, b)| (a * b).abs()).sum();
                let got = dot(isa, &a, &b);
                let want = dot_scalar(&a, &b);
                assert!(
                    (got - want).abs() <= F32_REORDER_TOL * magnitude.max(1.0),
                    "{isa:?} n={n}"
                );
                let mut y1 = b.clone();
                let mut y2 = b.clone();
                axpy(isa, 0.75, &a, &mut y1);
                axpy_scalar(0.75, &a, &mut y2);
                // FMA rounds once, mul+add twice: within an ulp or two.
                for (u, v) in y1.iter().zip(&y2) {
                    assert!((u - v).abs() <= 4.0 * f32::EPSILON, "{isa:?} n={n}");
                }
            }
            println!("vecmath checked on {}", isa.get());
        }
    }
}
