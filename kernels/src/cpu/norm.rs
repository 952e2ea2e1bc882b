//! RMS normalization: `out = weight · x / sqrt(mean(x²) + eps)` per row.

use super::disjoint::DisjointSlice;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::KernelError;

/// Rows per task once a batch is worth splitting.
const ROWS_PER_TASK: usize = 8;

pub(crate) fn rms_norm(
    pool: &ThreadPool,
    x: &CpuActivations,
    weight: &[f32],
    eps: f32,
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    check_shapes(x, weight, out)?;
    let cols = x.cols;
    if cols == 0 {
        return Ok(());
    }
    let out_data = DisjointSlice::new(&mut out.data);
    pool.for_each_range(x.rows, ROWS_PER_TASK, &|rows| {
        for row in rows {
            // SAFETY: each row belongs to exactly one task.
            let o = unsafe { out_data.range(row * cols, cols) };
            rms_norm_row(&x.data[row * cols..(row + 1) * cols], weight, eps, o);
        }
    });
    Ok(())
}

/// Checks that `weight` has `x`'s width and `out` is shaped like `x`.
pub(crate) fn check_shapes(
    x: &CpuActivations,
    weight: &[f32],
    out: &CpuActivations,
) -> Result<(), KernelError> {
    if weight.len() != x.cols || out.rows != x.rows || out.cols != x.cols {
        return Err(KernelError::Shape {
            op: "rms_norm",
            detail: format!(
                "x is {}, weight has {} values, out is {}; need weight of x's width and out shaped like x",
                x.shape(),
                weight.len(),
                out.shape()
            ),
        });
    }
    Ok(())
}

/// One row. The sum of squares is taken in f32 over eight interleaved
/// partial sums: deterministic on every ISA, and vectorizable.
pub(crate) fn rms_norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mut partial = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (p, v) in partial.iter_mut().zip(chunk) {
            *p += v * v;
        }
    }
    let mut sum: f32 = partial.iter().sum();
    sum += chunks.remainder().iter().map(|v| v * v).sum::<f32>();
    let inv = 1.0 / (sum / x.len() as f32 + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// Normalizes each `weight.len()`-wide head of every row of `x` in place
/// (per-head query and key norms), as [`rms_norm_row`] does a row.
pub(crate) fn rms_norm_heads(
    pool: &ThreadPool,
    x: &mut CpuActivations,
    weight: &[f32],
    eps: f32,
) -> Result<(), KernelError> {
    let width = weight.len();
    if width == 0 || !x.cols.is_multiple_of(width) {
        return Err(KernelError::Shape {
            op: "rms_norm_heads",
            detail: format!(
                "x is {}, heads of {width}; the width must be whole heads",
                x.shape()
            ),
        });
    }
    let heads = x.rows * (x.cols / width);
    let data = DisjointSlice::new(&mut x.data);
    pool.for_each_range(heads, ROWS_PER_TASK * 4, &|range| {
        let mut input = vec![0.0f32; width];
        for head in range {
            // SAFETY: each head belongs to exactly one task.
            let h = unsafe { data.range(head * width, width) };
            input.copy_from_slice(h);
            rms_norm_row(&input, weight, eps, h);
        }
    });
    Ok(())
}
