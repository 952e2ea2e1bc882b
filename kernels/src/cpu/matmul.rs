//! `out = x · Wᵀ (+ bias)`: activation rows against weight rows.
//!
//! For quantized weights the activation rows are quantized once per call
//! (see `quant_act`); output columns (weight rows) are split across the
//! pool, and each task walks its weight rows, dotting each with the
//! activation rows a tile (4 or 8, by ISA) at a time so a decoded weight
//! block serves several tokens.

use std::cell::RefCell;

use super::disjoint::DisjointSlice;
use super::dot::{dot_float, dot_quantized, tile_rows};
use super::isa::CheckedIsa;
use super::quant_act::{QRow, QuantizedRows};
use super::tensors::{CpuActivations, CpuMatrix};
use super::threads::ThreadPool;
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
/// Weight rows per kernel call within a task (outputs buffered on the stack).
const SUB_CHUNK_ROWS: usize = 64;

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
    let tile = tile_rows(isa);
    // Each task: for each tile of activation rows, its weight rows in
    // sub-chunks whose outputs fit a stack buffer; the tile (a few KB) and
    // the sub-chunk's weights stay in L1 while they meet.
    let for_each_block = |range: std::ops::Range<usize>, dot: &BlockDot<'_>| {
        let mut buffer = [0.0f32; SUB_CHUNK_ROWS * 8];
        let mut first = 0;
        while first < n {
            // Whole tiles, then single rows.
            let count = if first + tile <= n { tile } else { 1 };
            let mut start = range.start;
            while start < range.end {
                let end = (start + SUB_CHUNK_ROWS).min(range.end);
                let o = &mut buffer[..(end - start) * count];
                dot(first, count, &data[start * row_bytes..end * row_bytes], o);
                for (row, values) in (start..end).zip(o.chunks_exact(count)) {
                    store(row, first, values);
                }
                start = end;
            }
            first += count;
        }
    };
    if dtype.is_quantized() {
        let run = |q: &QuantizedRows| {
            pool.for_each_range(rows, chunk, &|range| {
                for_each_block(range, &|first, count, w, o| match count {
                    8 => dot_quantized::<8>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
                    4 => dot_quantized::<4>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
                    _ => dot_quantized::<1>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
                });
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
        let xs = |first: usize| x.data.get(first * k..).unwrap_or_default();
        pool.for_each_range(rows, chunk, &|range| {
            for_each_block(range, &|first, count, w, o| match count {
                8 => dot_float::<8>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
                4 => dot_float::<4>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
                _ => dot_float::<1>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
            });
        });
    }
    Ok(())
}

/// `dot(first, count, weight_rows, out)`: activation rows
/// `first..first + count` against whole weight rows, `count` outputs per
/// weight row.
type BlockDot<'a> = dyn Fn(usize, usize, &[u8], &mut [f32]) + 'a;

/// `R` consecutive rows of width `k` from the start of `xs`.
fn float_rows<const R: usize>(xs: &[f32], k: usize) -> [&[f32]; R] {
    std::array::from_fn(|i| &xs[i * k..(i + 1) * k])
}

fn q_rows<const R: usize>(q: &QuantizedRows, first: usize) -> [QRow<'_>; R] {
    std::array::from_fn(|i| q.row(first + i))
}
