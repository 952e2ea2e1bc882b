//! Elementwise kernels: `gate = silu(gate) · up` and `x += y`.

use super::disjoint::DisjointSlice;
use super::exp;
use super::isa::CheckedIsa;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::KernelError;

/// Elements per task: below this a call runs on the caller alone, since
/// waking workers would cost more than the arithmetic.
const ELEMENTS_PER_TASK: usize = 16 * 1024;

pub(crate) fn same_shape(
    op: &'static str,
    a: &CpuActivations,
    b: &CpuActivations,
) -> Result<(), KernelError> {
    if a.rows == b.rows && a.cols == b.cols {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            detail: format!(
                "operands are {} and {}; they must match",
                a.shape(),
                b.shape()
            ),
        })
    }
}

/// `gate = silu(gate) · up`, with the vectorised `exp` of [`exp`].
pub(crate) fn silu_mul(
    pool: &ThreadPool,
    isa: CheckedIsa,
    gate: &mut CpuActivations,
    up: &CpuActivations,
) -> Result<(), KernelError> {
    same_shape("silu_mul", gate, up)?;
    let len = gate.data.len();
    let gate_data = DisjointSlice::new(&mut gate.data);
    pool.for_each_range(len, ELEMENTS_PER_TASK, &|range| {
        // SAFETY: for_each_range's ranges are disjoint.
        let g = unsafe { gate_data.range(range.start, range.len()) };
        exp::silu_mul(isa, g, &up.data[range]);
    });
    Ok(())
}

pub(crate) fn add(
    pool: &ThreadPool,
    x: &mut CpuActivations,
    y: &CpuActivations,
) -> Result<(), KernelError> {
    same_shape("add", x, y)?;
    let len = x.data.len();
    let x_data = DisjointSlice::new(&mut x.data);
    pool.for_each_range(len, ELEMENTS_PER_TASK * 4, &|range| {
        // SAFETY: for_each_range's ranges are disjoint.
        let x = unsafe { x_data.range(range.start, range.len()) };
        for (x, y) in x.iter_mut().zip(&y.data[range]) {
            *x += y;
        }
    });
    Ok(())
}
