//! The expand half of a LoRA update, `acc += Σⱼ p[j] · values[j]`, over
//! rows of `values` stored as F32 or BF16 bytes (an adapter's `Bᵀ`) and
//! widened to f32 in registers: a BF16 adapter is read at half the bytes,
//! and the arithmetic stays f32 (one fused multiply-add per term, in
//! order), so every ISA gives the scalar loop's bits.

use super::isa::{CheckedIsa, Isa};
use crate::DType;
use scalar::expand_scalar;

/// Whether [`expand`] reads values of `dtype`.
pub(crate) fn expands(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// `acc += Σⱼ p[j] · row j of values`, each row `acc.len()` elements of
/// `dtype` (F32 or BF16; see [`expands`]). Rows past the end of `values`
/// are not read.
pub(crate) fn expand(isa: CheckedIsa, dtype: DType, p: &[f32], values: &[u8], acc: &mut [f32]) {
    let bf16 = dtype == DType::BF16;
    let size = if bf16 { 2 } else { 4 };
    let width = acc.len();
    let rows = p.len().min(values.len() / (width * size).max(1));
    let (p, values) = (&p[..rows], &values[..rows * width * size]);
    match isa.get() {
        // SAFETY: CheckedIsa guarantees the features; `values` holds
        // `p.len()` rows of `acc.len()` elements (cut above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::expand_avx512(bf16, p, values, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::expand_avx2(bf16, p, values, acc) },
        _ => expand_scalar(bf16, p, values, acc, 0),
    }
}

/// The scalar loop, in its own module so that the x86 kernels (which end
/// each row with it) and their parent both reach it without a cycle.
mod scalar {
    use crate::formats::blocks::{bf16_at, f32_at};

    /// The scalar loop for elements `from..` of each row (the SIMD kernels'
    /// tail takes it too, so a row's bits do not depend on where it ends).
    pub(super) fn expand_scalar(
        bf16: bool,
        p: &[f32],
        values: &[u8],
        acc: &mut [f32],
        from: usize,
    ) {
        let width = acc.len();
        for (c, a) in acc.iter_mut().enumerate().skip(from) {
            for (j, p) in p.iter().enumerate() {
                let at = j * width + c;
                let v = if bf16 {
                    bf16_at(values, 2 * at)
                } else {
                    f32_at(values, 4 * at)
                };
                *a = p.mul_add(v, *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass `values` of `p.len()` rows of `acc.len()` elements
    //! (two bytes each for BF16, four for F32) and have the named features.
    use std::arch::x86_64::*;

    /// Sixteen elements of a row at `v` (element `at`), widened to f32:
    /// the masked-off lanes read nothing and are zero.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn load16(bf16: bool, v: *const u8, at: usize, mask: __mmask16) -> __m512 {
        if bf16 {
            // Sixteen u16 lanes of a 512-bit masked load (BW's word mask),
            // widened to u32 and shifted up: the bits of the f32.
            let half = _mm512_maskz_loadu_epi16(mask as __mmask32, v.wrapping_add(2 * at).cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm512_castsi512_si256(half),
            )))
        } else {
            _mm512_maskz_loadu_ps(mask, v.wrapping_add(4 * at).cast())
        }
    }

    /// Sixty-four elements of `acc` at a time in four registers: four
    /// independent chains of fused multiply-adds (one chain would wait on
    /// the previous row's result at every row).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn expand_avx512(bf16: bool, p: &[f32], values: &[u8], acc: &mut [f32]) {
        let width = acc.len();
        let mask_at = |at: usize| -> __mmask16 {
            ((1u32 << width.saturating_sub(at).min(16)) - 1) as __mmask16
        };
        let v = values.as_ptr();
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
            for (j, p) in p.iter().enumerate() {
                let p = _mm512_set1_ps(*p);
                for k in 0..4 {
                    // Past the row's end the offset is only formed, never
                    // read through (masked off).
                    let w = load16(bf16, v, j * width + c + 16 * k, m[k]);
                    sum[k] = _mm512_fmadd_ps(p, w, sum[k]);
                }
            }
            for k in 0..4 {
                _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[k]);
            }
            c += 64;
        }
    }

    /// Eight elements of a row at `v` (element `at`), widened to f32.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load8(bf16: bool, v: *const u8, at: usize) -> __m256 {
        if bf16 {
            let half = _mm_loadu_si128(v.add(2 * at).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half)))
        } else {
            _mm256_loadu_ps(v.add(4 * at).cast())
        }
    }

    /// [`expand_avx512`] in eight-lane registers over the whole vectors of
    /// eight; the scalar loop takes the rest (same operations).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn expand_avx2(bf16: bool, p: &[f32], values: &[u8], acc: &mut [f32]) {
        let width = acc.len();
        let whole = width / 8 * 8;
        let v = values.as_ptr();
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
                for (k, s) in sum.iter_mut().enumerate().take(lanes) {
                    *s = _mm256_fmadd_ps(pv, load8(bf16, v, j * width + c + 8 * k), *s);
                }
            }
            for (k, s) in sum.iter().enumerate().take(lanes) {
                _mm256_storeu_ps(out.add(8 * k), *s);
            }
            c += 8 * lanes;
        }
        super::scalar::expand_scalar(bf16, p, values, acc, whole);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every ISA gives the scalar loop's bits, for both types and widths
    /// that end inside a vector (of 8 and of 16) and inside a 64 chunk.
    #[test]
    fn every_isa_gives_the_scalar_bits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for width in [1usize, 7, 8, 13, 64, 80, 577] {
            let rank = 5;
            let p: Vec<f32> = (0..rank).map(|_| rng.random_range(-1.0..1.0)).collect();
            let base: Vec<f32> = (0..width).map(|_| rng.random_range(-1.0..1.0)).collect();
            let values: Vec<f32> = (0..rank * width)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            for dtype in [DType::F32, DType::BF16] {
                let bytes: Vec<u8> = if dtype == DType::BF16 {
                    values
                        .iter()
                        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                        .collect()
                } else {
                    values.iter().flat_map(|v| v.to_le_bytes()).collect()
                };
                let mut want = base.clone();
                expand_scalar(dtype == DType::BF16, &p, &bytes, &mut want, 0);
                // The scalar loop is the plain sum of widened values.
                for (c, w) in want.iter().enumerate() {
                    let mut a = base[c];
                    for (j, p) in p.iter().enumerate() {
                        let v = values[j * width + c];
                        let v = if dtype == DType::BF16 {
                            half::bf16::from_f32(v).to_f32()
                        } else {
                            v
                        };
                        a = p.mul_add(v, a);
                    }
                    assert_eq!(a.to_bits(), w.to_bits());
                }
                for isa in Isa::supported() {
                    let mut got = base.clone();
                    expand(CheckedIsa::at_most(isa), dtype, &p, &bytes, &mut got);
                    assert_eq!(got, want, "{isa:?} {dtype} width {width}");
                }
            }
        }
    }
}
