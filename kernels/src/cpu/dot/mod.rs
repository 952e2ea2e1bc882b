//! Dot products of one weight row with up to [`tile_rows`] activation rows.
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
mod avx2_lanes;
#[cfg(target_arch = "x86_64")]
mod avx2_low_bit;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_low_bit;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;
mod scalar_low_bit;

use super::isa::CheckedIsa;
use super::quant_act::{spread_len, QRow};
use super::Isa;
use crate::DType;

/// Activation rows one kernel call takes for a batch: AVX-512 has 32
/// vector registers, room for eight rows' accumulators; AVX2's 16 hold four.
pub(crate) fn tile_rows(isa: CheckedIsa) -> usize {
    if isa.get() >= Isa::Avx512 {
        8
    } else {
        4
    }
}

/// `out[row · R + r] = W[row] · a[r]` for every whole row of `row_bytes`
/// in `w` and a quantized `dtype`. Taking many weight rows per call keeps
/// the ISA and type dispatch (and these checks) out of the per-row path: a
/// 576-wide Q4_1 row takes only ~30 ns.
///
/// # Panics
/// When the shapes disagree (`w` not whole rows of `a[r].qs.len()`
/// elements, `out` not `R` per row, activations inconsistent, AVX-512 spread
/// scales missing): callers validate shapes first, so this guards the SIMD
/// code's unchecked loads against internal bugs.
pub(crate) fn dot_quantized<const R: usize>(
    isa: CheckedIsa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    a: &[QRow<'_>; R],
    out: &mut [f32],
) {
    let k = a.first().map_or(0, |a| a.qs.len());
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    assert!(
        dtype.is_quantized()
            && dtype.bytes_for(k) == Some(row_bytes)
            && w.len() == rows * row_bytes
            && out.len() == rows * R
            && a.iter()
                .all(|a| a.qs.len() == k && a.ds.len() == 2 * (k / 32))
            && (isa.get() < Isa::Avx512 || a.iter().all(|a| a.spread.len() == spread_len(k / 32))),
        "dot_quantized: {dtype} rows of {row_bytes} bytes ({} in all) against activations of {k}",
        w.len()
    );
    match isa.get() {
        Isa::Scalar => scalar::dot_quantized(dtype, w, row_bytes, a, out),
        // SAFETY: CheckedIsa guarantees NEON; shapes checked above.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe { neon::dot_quantized(dtype, w, row_bytes, a, out) },
        // SAFETY: CheckedIsa guarantees the features; shapes checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_quantized(dtype, w, row_bytes, a, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if avx512_low_bit::takes(dtype) => unsafe {
            avx512_low_bit::plain::dot_quantized(dtype, w, row_bytes, a, out)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni if avx512_low_bit::takes(dtype) => unsafe {
            avx512_low_bit::vnni::dot_quantized(dtype, w, row_bytes, a, out)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::plain::dot_quantized(dtype, w, row_bytes, a, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::vnni::dot_quantized(dtype, w, row_bytes, a, out) },
        // Levels of another architecture (never checked on this one).
        #[allow(unreachable_patterns)]
        _ => scalar::dot_quantized(dtype, w, row_bytes, a, out),
    }
}

/// `out[row · R + r] = W[row] · x[r]` for a float `dtype` (F32, F16, BF16).
///
/// # Panics
/// As [`dot_quantized`], on inconsistent shapes.
pub(crate) fn dot_float<const R: usize>(
    isa: CheckedIsa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    x: &[&[f32]; R],
    out: &mut [f32],
) {
    let k = x.first().map_or(0, |x| x.len());
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    assert!(
        !dtype.is_quantized()
            && dtype.bytes_for(k) == Some(row_bytes)
            && w.len() == rows * row_bytes
            && out.len() == rows * R
            && x.iter().all(|x| x.len() == k),
        "dot_float: {dtype} rows of {row_bytes} bytes ({} in all) against activations of {k}",
        w.len()
    );
    match isa.get() {
        Isa::Scalar => scalar::dot_float(dtype, w, row_bytes, x, out),
        // SAFETY: CheckedIsa guarantees the features; shapes checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_float(dtype, w, row_bytes, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::plain::dot_float(dtype, w, row_bytes, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { avx512::vnni::dot_float(dtype, w, row_bytes, x, out) },
        // NEON has no float kernels yet; other architectures' levels are
        // never checked on this one.
        _ => scalar::dot_float(dtype, w, row_bytes, x, out),
    }
}
