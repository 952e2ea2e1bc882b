//! Elementwise kernels of the Gemma family: GeGLU gating with the tanh
//! approximation of GELU, and scalar maps (embedding scale, logit
//! soft-capping). GeGLU runs on every MLP row, beside the down product's
//! quantization (see `matmul_input`), so it has an AVX-512 twin; the maps
//! run once per step on one row and stay scalar.

use super::disjoint::DisjointSlice;
use super::elementwise::same_shape;
use super::exp::exp_scalar;
use super::isa::CheckedIsa;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
#[cfg(target_arch = "x86_64")]
use super::Isa;
use crate::KernelError;
use tanh_form::{K0, K1};

/// Elements per task (see `elementwise`): `exp` costs more than an add.
const ELEMENTS_PER_TASK: usize = 8 * 1024;

/// GELU's tanh form, shared by the scalar path and its AVX-512 twin.
mod tanh_form {
    /// `sqrt(2 / π)`, GELU's tanh-approximation constant.
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    /// `-2 · sqrt(2 / π)` and `-2 · sqrt(2 / π) · 0.044715`: GELU's tanh form
    /// `0.5 · x · (1 + tanh(u))` is `x / (1 + e^(-2u))`, one `exp` and one
    /// divide, as SiLU is, with `-2u = x · (K0 + K1 · x²)`.
    pub(super) const K0: f32 = -2.0 * SQRT_2_OVER_PI;
    pub(super) const K1: f32 = -2.0 * SQRT_2_OVER_PI * 0.044_715;
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), in the form
/// above; the AVX-512 twin computes the same operations bit for bit.
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    x / (1.0 + exp_scalar(x * K1.mul_add(x * x, K0)))
}

/// `g_i = gelu_tanh(g_i) · u_i` over the common length.
pub(crate) fn gelu_mul_row(isa: CheckedIsa, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; equal lengths above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::gelu_mul(g, u) },
        _ => gelu_mul_scalar(g, u),
    }
}

fn gelu_mul_scalar(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = gelu_tanh(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::tanh_form::{K0, K1};
    use crate::cpu::exp::x86::exp16;

    /// # Safety
    /// AVX-512 F; `g.len() == u.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu_mul(g: &mut [f32], u: &[f32]) {
        let n = g.len();
        let one = _mm512_set1_ps(1.0);
        let (k0, k1) = (_mm512_set1_ps(K0), _mm512_set1_ps(K1));
        let mut i = 0;
        while i < n {
            let mask = ((1u32 << (n - i).min(16)) - 1) as __mmask16;
            // SAFETY: the masked lanes lie inside both slices.
            unsafe {
                let p = g.as_mut_ptr().add(i);
                let x = _mm512_maskz_loadu_ps(mask, p);
                let uv = _mm512_maskz_loadu_ps(mask, u.as_ptr().add(i));
                let z = _mm512_mul_ps(x, _mm512_fmadd_ps(k1, _mm512_mul_ps(x, x), k0));
                let gelu = _mm512_div_ps(x, _mm512_add_ps(one, exp16(z)));
                _mm512_mask_storeu_ps(p, mask, _mm512_mul_ps(gelu, uv));
            }
            i += 16;
        }
    }
}

/// `gate = gelu_tanh(gate) · up`.
pub(crate) fn gelu_mul(
    pool: &ThreadPool,
    isa: CheckedIsa,
    gate: &mut CpuActivations,
    up: &CpuActivations,
) -> Result<(), KernelError> {
    same_shape("gelu_mul", gate, up)?;
    let len = gate.data.len();
    let gate_data = DisjointSlice::new(&mut gate.data);
    pool.for_each_range(len, ELEMENTS_PER_TASK, &|range| {
        // SAFETY: for_each_range's ranges are disjoint.
        let g = unsafe { gate_data.range(range.start, range.len()) };
        gelu_mul_row(isa, g, &up.data[range]);
    });
    Ok(())
}

/// `x = f(x)` for every element.
pub(crate) fn map(pool: &ThreadPool, x: &mut CpuActivations, f: impl Fn(f32) -> f32 + Sync) {
    let len = x.data.len();
    let data = DisjointSlice::new(&mut x.data);
    pool.for_each_range(len, ELEMENTS_PER_TASK, &|range| {
        // SAFETY: for_each_range's ranges are disjoint.
        let x = unsafe { data.range(range.start, range.len()) };
        for v in x.iter_mut() {
            *v = f(*v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_gelu_mul_is_bit_identical_to_the_scalar_twin() {
        let x: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.173).collect();
        let u: Vec<f32> = (0..203).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut want = x.clone();
        gelu_mul_scalar(&mut want, &u);
        for isa in crate::cpu::Isa::supported() {
            let mut got = x.clone();
            gelu_mul_row(CheckedIsa::at_most(isa), &mut got, &u);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa}");
        }
    }

    #[test]
    fn gelu_tanh_matches_the_closed_form_in_f64() {
        for i in -80..=80 {
            let x = i as f64 / 10.0;
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want = 0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh());
            let got = gelu_tanh(x as f32) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "x={x}: {got} vs {want}"
            );
        }
    }
}
