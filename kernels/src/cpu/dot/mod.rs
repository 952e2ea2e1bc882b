//! Dot products of one weight row with up to [`TILE`] activation rows.
//!
//! The per-type table of ggml (`type_traits_cpu`), as a match: quantized
//! weights pair with activations quantized per `quant_act`; float weights
//! (F32, F16, BF16) with the f32 activations themselves. Each ISA has its own
//! module; `scalar` is the reference the others are tested against.
//!
//! Taking several activation rows per call lets a kernel decode each weight
//! block once and use it for all of them: the register tiling that makes a
//! batch of `n` rows cheaper than `n` matrix-vector products.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;

use super::isa::CheckedIsa;
use super::quant_act::QRow;
use super::Isa;
use crate::DType;

/// Most activation rows one kernel call takes.
pub(crate) const TILE: usize = 4;

/// `out[r] = W_row · a[r]` for a quantized `dtype`.
///
/// # Panics
/// When `w` is not one row of `a[r].qs.len()` elements of `dtype` or the
/// rows disagree in length: callers validate shapes first, so this guards
/// the SIMD code's unchecked loads against internal bugs.
pub(crate) fn dot_quantized<const R: usize>(
    isa: CheckedIsa,
    dtype: DType,
    w: &[u8],
    a: &[QRow<'_>; R],
    out: &mut [f32; R],
) {
    let k = a.first().map_or(0, |a| a.qs.len());
    assert!(
        dtype.is_quantized()
            && dtype.bytes_for(k) == Some(w.len())
            && a.iter()
                .all(|a| a.qs.len() == k && a.ds.len() == 2 * (k / 32)),
        "dot_quantized: {dtype} row of {} bytes against activations of {k}",
        w.len()
    );
    match isa.get() {
        Isa::Scalar => scalar::dot_quantized(dtype, w, a, out),
        // SAFETY: CheckedIsa guarantees the features; shapes checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_quantized(dtype, w, a, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::plain::dot_quantized(dtype, w, a, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::vnni::dot_quantized(dtype, w, a, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::dot_quantized(dtype, w, a, out),
    }
}

/// `out[r] = W_row · x[r]` for a float `dtype` (F32, F16, BF16).
///
/// # Panics
/// As [`dot_quantized`], on inconsistent shapes.
pub(crate) fn dot_float<const R: usize>(
    isa: CheckedIsa,
    dtype: DType,
    w: &[u8],
    x: &[&[f32]; R],
    out: &mut [f32; R],
) {
    let k = x.first().map_or(0, |x| x.len());
    assert!(
        !dtype.is_quantized()
            && dtype.bytes_for(k) == Some(w.len())
            && x.iter().all(|x| x.len() == k),
        "dot_float: {dtype} row of {} bytes against activations of {k}",
        w.len()
    );
    match isa.get() {
        Isa::Scalar => scalar::dot_float(dtype, w, x, out),
        // SAFETY: CheckedIsa guarantees the features; shapes checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_float(dtype, w, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::plain::dot_float(dtype, w, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::vnni::dot_float(dtype, w, x, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::dot_float(dtype, w, x, out),
    }
}
