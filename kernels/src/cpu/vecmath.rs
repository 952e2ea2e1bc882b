//! f32 vector primitives for attention: `x *= c` and the weighted sum of
//! value rows.

use super::isa::CheckedIsa;
#[cfg(any(target_arch = "x86_64", test))]
use super::Isa;

/// `x_i *= c`.
pub(crate) fn scale_in_place(isa: CheckedIsa, c: f32, x: &mut [f32]) {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees the features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::scale_avx512(c, x) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::scale_avx2(c, x) },
        _ => x.iter_mut().for_each(|x| *x *= c),
    }
}

/// `x_i = b · y_i + a · x_i`, with one rounded product and one fused
/// multiply-add per element on every ISA (merging softmax states).
pub(crate) fn scale_add(isa: CheckedIsa, a: f32, x: &mut [f32], b: f32, y: &[f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&mut x[..n], &y[..n]);
    // AVX2 takes whole vectors of eight and says how far it got; the
    // scalar loop does the rest (AVX-512 masks its tail and does all).
    let done = match isa.get() {
        // SAFETY: CheckedIsa guarantees the features; equal lengths.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe {
            x86::scale_add_avx512(a, x, b, y);
            n
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::scale_add_avx2(a, x, b, y) },
        _ => 0,
    };
    scale_add_scalar(a, &mut x[done..], b, &y[done..]);
}

fn scale_add_scalar(a: f32, x: &mut [f32], b: f32, y: &[f32]) {
    for (x, y) in x.iter_mut().zip(y) {
        *x = b.mul_add(*y, *x * a);
    }
}

/// `acc += Σ_j p_j · values[j]`, where `values` holds `p.len()` rows of
/// `acc.len()` floats. Each element adds its terms in order of `j` with one
/// fused multiply-add each, on every ISA (so SIMD and scalar agree bit for
/// bit); the SIMD code keeps sixteen elements of `acc` in a register
/// across all the rows.
pub(crate) fn weighted_sum(isa: CheckedIsa, p: &[f32], values: &[f32], acc: &mut [f32]) {
    let width = acc.len();
    let rows = p.len().min(values.len() / width.max(1));
    let (p, values) = (&p[..rows], &values[..rows * width]);
    match isa.get() {
        // SAFETY: CheckedIsa guarantees the features; `values` holds
        // `p.len()` rows of `acc.len()` (cut above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::weighted_sum_avx512(p, values, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::weighted_sum_avx2(p, values, acc) },
        _ => weighted_sum_scalar(p, values, acc),
    }
}

/// Queries [`weighted_sum_group`] takes at once (sixteen accumulators of
/// 64 elements' worth, plus the shared value row, fit 32 registers).
pub(crate) const GROUP_MAX: usize = 4;

/// [`weighted_sum`] for up to [`GROUP_MAX`] weight rows `ps[h]` over the
/// same `values`, into `acc`'s consecutive runs of `width` (one per
/// weight row): each run bit for bit what `weighted_sum` gives it (the same
/// multiply-adds in the same order); the queries only share each value
/// row's load.
pub(crate) fn weighted_sum_group(isa: CheckedIsa, ps: &[&[f32]], values: &[f32], acc: &mut [f32]) {
    let g = ps.len();
    let width = acc.len().checked_div(g).unwrap_or(0);
    let rows = ps.first().map_or(0, |p| p.len());
    let fits = g <= GROUP_MAX
        && width > 0
        && ps.iter().all(|p| p.len() == rows)
        && values.len() >= rows * width;
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; `fits` checked the
        // lengths the kernel reads.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni if fits => unsafe {
            let acc = &mut acc[..g * width];
            match g {
                1 => x86::weighted_sum_group_avx512::<1>(ps, values, acc, width),
                2 => x86::weighted_sum_group_avx512::<2>(ps, values, acc, width),
                3 => x86::weighted_sum_group_avx512::<3>(ps, values, acc, width),
                _ => x86::weighted_sum_group_avx512::<4>(ps, values, acc, width),
            }
        },
        _ => {
            for (p, acc) in ps.iter().zip(acc.chunks_exact_mut(width.max(1))) {
                weighted_sum(isa, p, values, acc);
            }
        }
    }
}

pub(crate) fn weighted_sum_scalar(p: &[f32], values: &[f32], acc: &mut [f32]) {
    let width = acc.len();
    for (j, p) in p.iter().enumerate() {
        for (a, v) in acc.iter_mut().zip(&values[j * width..(j + 1) * width]) {
            *a = p.mul_add(*v, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass slices of equal length and have the named features.
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_avx512(c: f32, x: &mut [f32]) {
        let n = x.len();
        let vc = _mm512_set1_ps(c);
        let mut i = 0;
        while i < n {
            let mask: __mmask16 = ((1u32 << (n - i).min(16)) - 1) as __mmask16;
            let p = x.as_mut_ptr().add(i);
            _mm512_mask_storeu_ps(p, mask, _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(mask, p)));
            i += 16;
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_add_avx512(a: f32, x: &mut [f32], b: f32, y: &[f32]) {
        let n = x.len();
        let (va, vb) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
        let mut i = 0;
        while i < n {
            let mask: __mmask16 = ((1u32 << (n - i).min(16)) - 1) as __mmask16;
            let p = x.as_mut_ptr().add(i);
            let xa = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p), va);
            let yv = _mm512_maskz_loadu_ps(mask, y.as_ptr().add(i));
            _mm512_mask_storeu_ps(p, mask, _mm512_fmadd_ps(vb, yv, xa));
            i += 16;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scale_avx2(c: f32, x: &mut [f32]) {
        let whole = x.len() / 8 * 8;
        let vc = _mm256_set1_ps(c);
        for i in (0..whole).step_by(8) {
            let p = x.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_mul_ps(vc, _mm256_loadu_ps(p)));
        }
        x[whole..].iter_mut().for_each(|x| *x *= c);
    }

    #[target_feature(enable = "avx2,fma")]
    /// Returns how many elements it did (the whole vectors of eight).
    pub(super) unsafe fn scale_add_avx2(a: f32, x: &mut [f32], b: f32, y: &[f32]) -> usize {
        let whole = x.len() / 8 * 8;
        let (va, vb) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
        for i in (0..whole).step_by(8) {
            let p = x.as_mut_ptr().add(i);
            let xa = _mm256_mul_ps(_mm256_loadu_ps(p), va);
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            _mm256_storeu_ps(p, _mm256_fmadd_ps(vb, yv, xa));
        }
        whole
    }

    /// [`weighted_sum_avx512`] in eight-lane registers: thirty-two
    /// elements of `acc` at a time, four chains; the rest of a row that
    /// does not fill eight lanes takes the scalar loop (same operations).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_sum_avx2(p: &[f32], values: &[f32], acc: &mut [f32]) {
        let width = acc.len();
        let whole = width / 8 * 8;
        let mut c = 0;
        while c < whole {
            let lanes = ((whole - c) / 8).min(4);
            let out = acc.as_mut_ptr().add(c);
            let mut sum = [_mm256_setzero_ps(); 4];
            for (k, s) in sum.iter_mut().enumerate().take(lanes) {
                *s = _mm256_loadu_ps(out.add(8 * k));
            }
            for (j, p) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(*p);
                let v = values.as_ptr().add(j * width + c);
                for (k, s) in sum.iter_mut().enumerate().take(lanes) {
                    *s = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.add(8 * k)), *s);
                }
            }
            for (k, s) in sum.iter().enumerate().take(lanes) {
                _mm256_storeu_ps(out.add(8 * k), *s);
            }
            c += 8 * lanes;
        }
        if whole < width {
            for (j, p) in p.iter().enumerate() {
                let row = &values[j * width + whole..(j + 1) * width];
                for (a, v) in acc[whole..].iter_mut().zip(row) {
                    *a = p.mul_add(*v, *a);
                }
            }
        }
    }

    /// [`weighted_sum_avx512`] for `G` weight rows of equal length over the
    /// same value rows, sixty-four elements at a time: each run of `acc`
    /// gets the same chains as there.
    ///
    /// # Safety
    /// AVX-512 F; `ps.len() == G`, `acc.len() == G · width`, `values` holds
    /// `ps[0].len()` rows of `width`.
    // Index loops over constant bounds: fully unrolled, every `sum[h][k]`
    // is a register; iterators over `sum` would borrow the array instead.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_sum_group_avx512<const G: usize>(
        ps: &[&[f32]],
        values: &[f32],
        acc: &mut [f32],
        width: usize,
    ) {
        let rows = ps[0].len();
        let p: [*const f32; G] = std::array::from_fn(|h| ps[h].as_ptr());
        let mask_at = |at: usize| -> __mmask16 {
            ((1u32 << width.saturating_sub(at).min(16)) - 1) as __mmask16
        };
        let mut c = 0;
        while c < width {
            let m = [
                mask_at(c),
                mask_at(c + 16),
                mask_at(c + 32),
                mask_at(c + 48),
            ];
            let mut sum = [[_mm512_setzero_ps(); 4]; G];
            for h in 0..G {
                let out = acc.as_mut_ptr().add(h * width + c);
                for k in 0..4 {
                    // A zero mask loads nothing (and cannot fault).
                    sum[h][k] = _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k));
                }
            }
            // Wrapping offsets: past the last chunk the pointers are only
            // formed, never read through (masked off).
            let mut v = values.as_ptr().add(c);
            for j in 0..rows {
                let row = [
                    _mm512_maskz_loadu_ps(m[0], v),
                    _mm512_maskz_loadu_ps(m[1], v.wrapping_add(16)),
                    _mm512_maskz_loadu_ps(m[2], v.wrapping_add(32)),
                    _mm512_maskz_loadu_ps(m[3], v.wrapping_add(48)),
                ];
                for h in 0..G {
                    let w = _mm512_set1_ps(*p[h].add(j));
                    for k in 0..4 {
                        sum[h][k] = _mm512_fmadd_ps(w, row[k], sum[h][k]);
                    }
                }
                v = v.wrapping_add(width);
            }
            for h in 0..G {
                let out = acc.as_mut_ptr().add(h * width + c);
                for k in 0..4 {
                    _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[h][k]);
                }
            }
            c += 64;
        }
    }

    /// `values` holds `p.len()` rows of `acc.len()` floats. Sixty-four
    /// elements of `acc` at a time, in four registers: four independent
    /// chains of fused multiply-adds, where one chain would wait on the
    /// previous row's result (the FMA latency) at every row.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_sum_avx512(p: &[f32], values: &[f32], acc: &mut [f32]) {
        let width = acc.len();
        let mask_at = |at: usize| -> __mmask16 {
            ((1u32 << width.saturating_sub(at).min(16)) - 1) as __mmask16
        };
        let mut c = 0;
        while c < width {
            let m = [
                mask_at(c),
                mask_at(c + 16),
                mask_at(c + 32),
                mask_at(c + 48),
            ];
            let out = acc.as_mut_ptr().add(c);
            let mut sum = [_mm512_setzero_ps(); 4];
            for k in 0..4 {
                // A zero mask loads nothing (and cannot fault).
                sum[k] = _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k));
            }
            // Wrapping offsets: past the last chunk or row the pointers are
            // only formed, never read through (masked off, or the loop ends).
            let mut v = values.as_ptr().add(c);
            for p in p {
                let p = _mm512_set1_ps(*p);
                for k in 0..4 {
                    sum[k] = _mm512_fmadd_ps(
                        p,
                        _mm512_maskz_loadu_ps(m[k], v.wrapping_add(16 * k)),
                        sum[k],
                    );
                }
                v = v.wrapping_add(width);
            }
            for k in 0..4 {
                _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[k]);
            }
            c += 64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn simd_matches_scalar() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            for (rows, width) in [
                (0usize, 5usize),
                (1, 1),
                (3, 17),
                (32, 64),
                (7, 33),
                (5, 100),
                (2, 128),
            ] {
                let p: Vec<f32> = (0..rows).map(|_| rng.random_range(0.0..1.0)).collect();
                let v: Vec<f32> = (0..rows * width)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let start: Vec<f32> = (0..width).map(|_| rng.random_range(-1.0..1.0)).collect();
                let (mut got, mut want) = (start.clone(), start);
                weighted_sum(isa, &p, &v, &mut got);
                weighted_sum_scalar(&p, &v, &mut want);
                assert_eq!(got, want, "{isa:?} weighted_sum {rows}×{width}");
                for g in 1..=GROUP_MAX {
                    let ps: Vec<Vec<f32>> = (0..g)
                        .map(|_| (0..rows).map(|_| rng.random_range(0.0..1.0)).collect())
                        .collect();
                    let refs: Vec<&[f32]> = ps.iter().map(|p| &p[..]).collect();
                    let start: Vec<f32> = (0..g * width)
                        .map(|_| rng.random_range(-1.0..1.0))
                        .collect();
                    let mut grouped = start.clone();
                    weighted_sum_group(isa, &refs, &v, &mut grouped);
                    for (h, p) in ps.iter().enumerate() {
                        let mut one = start[h * width..(h + 1) * width].to_vec();
                        weighted_sum_scalar(p, &v, &mut one);
                        assert_eq!(
                            grouped[h * width..(h + 1) * width],
                            one[..],
                            "{isa:?} group {g} {rows}×{width}"
                        );
                    }
                }
                let mut scaled = got.clone();
                scale_in_place(isa, 0.3, &mut scaled);
                let want: Vec<f32> = got.iter().map(|g| g * 0.3).collect();
                assert_eq!(scaled, want, "{isa:?} scale {width}");
                let y: Vec<f32> = (0..width).map(|_| rng.random_range(-1.0..1.0)).collect();
                let (mut got2, mut want2) = (got.clone(), got.clone());
                scale_add(isa, 0.7, &mut got2, 0.2, &y);
                scale_add_scalar(0.7, &mut want2, 0.2, &y);
                assert_eq!(got2, want2, "{isa:?} scale_add {width}");
            }
            println!("vecmath checked on {}", isa.get());
        }
    }
}
