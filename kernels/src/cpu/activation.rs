//! Elementwise kernels of the Gemma family: GeGLU gating with the tanh
//! approximation of GELU, and scalar maps (embedding scale, logit
//! soft-capping). Scalar code: these run once per row on vectors far
//! smaller than the matrices around them.

use super::disjoint::DisjointSlice;
use super::elementwise::same_shape;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::KernelError;

/// Elements per task (see `elementwise`): `tanh` costs more than an add.
const ELEMENTS_PER_TASK: usize = 8 * 1024;

/// `sqrt(2 / π)`, GELU's tanh-approximation constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU with the tanh approximation (`gelu_pytorch_tanh`).
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// `gate = gelu_tanh(gate) · up`.
pub(crate) fn gelu_mul(
    pool: &ThreadPool,
    gate: &mut CpuActivations,
    up: &CpuActivations,
) -> Result<(), KernelError> {
    same_shape("gelu_mul", gate, up)?;
    let len = gate.data.len();
    let gate_data = DisjointSlice::new(&mut gate.data);
    pool.for_each_range(len, ELEMENTS_PER_TASK, &|range| {
        // SAFETY: for_each_range's ranges are disjoint.
        let g = unsafe { gate_data.range(range.start, range.len()) };
        for (g, u) in g.iter_mut().zip(&up.data[range]) {
            *g = gelu_tanh(*g) * u;
        }
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
