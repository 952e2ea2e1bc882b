//! `out = x · Wᵀ (+ bias)`: activation rows against weight rows.
//!
//! For quantized weights the activation rows are quantized once per call
//! (see `quant_act`); output columns (weight rows) are split across the
//! pool, and each task walks its weight rows, dotting each with the
//! activation rows [`TILE`] at a time so a decoded weight block serves
//! several tokens.

use std::cell::RefCell;

use super::dot::{dot_float, dot_quantized, TILE};
use super::isa::CheckedIsa;
use super::quant_act::{QRow, QuantizedRows};
use super::tensors::{CpuActivations, CpuMatrix};
use super::threads::{DisjointSlice, ThreadPool};
use crate::KernelError;

thread_local! {
    /// Quantized activations, reused so a matmul does not allocate.
    static SCRATCH: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// Weight rows per task: many small tasks per thread, so that a worker the
/// OS preempts in the middle of a task holds back little work (the caller
/// takes every task not yet claimed); claiming a task is one atomic add,
/// far cheaper than the ≥ 8 rows of dot products behind it.
const TASKS_PER_THREAD: usize = 16;
const MIN_ROWS_PER_TASK: usize = 8;

pub(crate) fn matmul(
    pool: &ThreadPool,
    isa: CheckedIsa,
    x: &CpuActivations,
    w: &CpuMatrix,
    bias: Option<&[f32]>,
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    let dtype = w.dtype();
    if x.cols != w.cols() || out.rows != x.rows || out.cols != w.rows() {
        return Err(KernelError::Shape {
            op: "matmul",
            detail: format!(
                "x is {}, W is {}×{} ({dtype}), out is {}; need x n×{2}, out n×{1}",
                x.shape(),
                w.rows(),
                w.cols(),
                out.shape()
            ),
        });
    }
    if let Some(bias) = bias {
        if bias.len() != w.rows() {
            return Err(KernelError::Shape {
                op: "matmul",
                detail: format!(
                    "bias has {} values for {} output rows",
                    bias.len(),
                    w.rows()
                ),
            });
        }
    }
    let n = x.rows;
    let rows = w.rows();
    let chunk = pool.chunk_for(rows, TASKS_PER_THREAD, MIN_ROWS_PER_TASK);
    let data: &[u8] = &w.view.data;
    let row_bytes = w.view.row_bytes();
    let out_rows = DisjointSlice::new(&mut out.data);
    let store = |row: usize, first: usize, values: &[f32]| {
        let add = bias.map_or(0.0, |b| b[row]);
        for (t, v) in values.iter().enumerate() {
            // SAFETY: each task owns the weight rows of its range, hence
            // the output column `row` of every activation row.
            unsafe { out_rows.write((first + t) * rows + row, v + add) };
        }
    };
    if dtype.is_quantized() {
        let run = |q: &QuantizedRows| {
            pool.for_each_range(rows, chunk, &|range| {
                for row in range {
                    let w_row = &data[row * row_bytes..(row + 1) * row_bytes];
                    tile_rows(n, |first, count| match count {
                        TILE => {
                            let mut o = [0.0; TILE];
                            dot_quantized(isa, dtype, w_row, &q_rows::<TILE>(q, first), &mut o);
                            store(row, first, &o);
                        }
                        _ => {
                            for t in first..first + count {
                                let mut o = [0.0; 1];
                                dot_quantized(isa, dtype, w_row, &[q.row(t)], &mut o);
                                store(row, t, &o);
                            }
                        }
                    });
                }
            });
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut q) => {
                q.quantize(pool, isa, &x.data, n, x.cols);
                run(&q);
            }
            // Only a nested matmul on this thread gets here; it pays for
            // its own buffer.
            Err(_) => {
                let mut q = QuantizedRows::default();
                q.quantize(pool, isa, &x.data, n, x.cols);
                run(&q);
            }
        });
    } else {
        let k = x.cols;
        pool.for_each_range(rows, chunk, &|range| {
            for row in range {
                let w_row = &data[row * row_bytes..(row + 1) * row_bytes];
                tile_rows(n, |first, count| {
                    if count == TILE {
                        let xs: [&[f32]; TILE] =
                            std::array::from_fn(|i| &x.data[(first + i) * k..(first + i + 1) * k]);
                        let mut o = [0.0; TILE];
                        dot_float(isa, dtype, w_row, &xs, &mut o);
                        store(row, first, &o);
                    } else {
                        for t in first..first + count {
                            let mut o = [0.0; 1];
                            dot_float(isa, dtype, w_row, &[&x.data[t * k..(t + 1) * k]], &mut o);
                            store(row, t, &o);
                        }
                    }
                });
            }
        });
    }
    Ok(())
}

/// Calls `f(first, count)` over `0..n` in groups of [`TILE`], then the rest.
#[inline]
fn tile_rows(n: usize, mut f: impl FnMut(usize, usize)) {
    let mut first = 0;
    while first + TILE <= n {
        f(first, TILE);
        first += TILE;
    }
    if first < n {
        f(first, n - first);
    }
}

fn q_rows<const R: usize>(q: &QuantizedRows, first: usize) -> [QRow<'_>; R] {
    std::array::from_fn(|i| q.row(first + i))
}
