//! AVX2 lane helpers the 32-element (`avx2`) and low-bit (`avx2_low_bit`)
//! dot products share: byte products, horizontal sums, f16 scale loads and
//! activation block loads.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C; the pointer ones read the
//! bytes their documentation names.

use std::arch::x86_64::*;

use crate::cpu::quant_act::QRow;
use crate::formats::blocks::QK;

/// `Σ u·s` over groups of four bytes → 8 × i32 (see the module note on
/// saturation).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn mul_sum_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The f16 pair at `p` (4 bytes), widened: `[a, b, 0, 0]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn f16_pair(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()))
}

/// The f16 at `p` (2 bytes), widened: `[a, 0, 0, 0]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn f16_one(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
        p.cast::<u16>().read_unaligned(),
    )))
}

/// The activation block `b`'s `[d, s, 0, 0]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn act_ds(a: &QRow<'_>, b: usize) -> __m128 {
    _mm_castsi128_ps(_mm_loadl_epi64(a.ds.as_ptr().add(2 * b).cast()))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn act_block(a: &QRow<'_>, b: usize) -> __m256i {
    _mm256_loadu_si256(a.qs.as_ptr().add(b * QK).cast())
}
