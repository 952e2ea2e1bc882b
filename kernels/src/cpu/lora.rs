//! LoRA updates for the rows of a mixed batch (the SGMV idea on the CPU):
//! each run of rows takes its adapter's shrink (`x · Aᵀ`, `rank` dot
//! products of the input width) and expand (`rank` scaled adds of rows of
//! `Bᵀ` into the output row), on top of the base product already there.
//!
//! The base's matrix multiplies run once for every row of a step; only
//! this low-rank part is per adapter. Its cost per row is
//! `2 · rank · (in + out)` flops, a few percent of the base's for ranks
//! up to 64. Rows are spread over the pool in pieces of one run; a row's
//! arithmetic never depends on the piece it falls in, so a row's result is
//! the same whichever rows share its step.

use std::ops::Range;

use super::disjoint::DisjointSlice;
use super::dot::dot_float;
use super::isa::CheckedIsa;
use super::tensors::{CpuActivations, CpuVector};
use super::threads::ThreadPool;
use super::vecmath::weighted_sum;
#[cfg(test)]
use super::vecmath::weighted_sum_scalar;
use crate::{DType, KernelError};

/// Rows one task takes (a decode step's run is often one row; a prompt's
/// many).
const ROWS_PER_TASK: usize = 8;

/// The largest rank the stack buffer of one row's shrink holds.
pub(crate) const MAX_RANK: usize = 256;

/// One run of rows and its adapter's tensors (see `LoraRows`).
pub(crate) struct Run<'a> {
    pub(crate) rows: Range<usize>,
    pub(crate) a: &'a CpuVector,
    pub(crate) b_t: &'a CpuVector,
    pub(crate) rank: usize,
    pub(crate) scale: f32,
}

/// `out[rows] += scale · (x[rows] · Aᵀ) · Bᵀ` for every run.
pub(crate) fn lora(
    pool: &ThreadPool,
    isa: CheckedIsa,
    x: &CpuActivations,
    runs: &[Run<'_>],
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    for run in runs {
        validate(x, run, out)?;
    }
    let (k, width) = (x.cols, out.cols);
    let tasks: Vec<(usize, Range<usize>)> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, run)| {
            let rows = run.rows.clone();
            rows.clone()
                .step_by(ROWS_PER_TASK)
                .map(move |s| (i, s..(s + ROWS_PER_TASK).min(rows.end)))
        })
        .collect();
    let target = DisjointSlice::new(&mut out.data);
    pool.run(tasks.len(), &|task| {
        let (i, rows) = &tasks[task];
        let run = &runs[*i];
        for r in rows.clone() {
            let input = &x.data[r * k..(r + 1) * k];
            // SAFETY: runs' rows are disjoint (validated by the caller's
            // contract and checked in `validate` to lie inside `out`), and
            // each row belongs to one task.
            let row = unsafe { target.range(r * width, width) };
            lora_row(isa, input, run, row);
        }
    });
    Ok(())
}

/// One row's update: shrink with the dot kernel of F32 weights, scale,
/// then expand as `rank` multiply-adds of `Bᵀ`'s rows.
fn lora_row(isa: CheckedIsa, x: &[f32], run: &Run<'_>, out: &mut [f32]) {
    let mut mid = [0.0f32; MAX_RANK];
    let mid = &mut mid[..run.rank];
    let a: &[u8] = bytemuck::cast_slice(&run.a.values);
    dot_float::<1>(isa, DType::F32, a, x.len() * 4, &[x], mid);
    mid.iter_mut().for_each(|m| *m *= run.scale);
    weighted_sum(isa, mid, &run.b_t.values, out);
}

/// The scalar twin of [`lora`] for one row, that tests compare against.
#[cfg(test)]
pub(crate) fn lora_row_scalar(x: &[f32], a: &[f32], b_t: &[f32], scale: f32, out: &mut [f32]) {
    let rank = a.len() / x.len().max(1);
    let mid: Vec<f32> = (0..rank)
        .map(|j| {
            let row = &a[j * x.len()..(j + 1) * x.len()];
            row.iter().zip(x).map(|(w, x)| w * x).sum::<f32>() * scale
        })
        .collect();
    weighted_sum_scalar(&mid, b_t, out);
}

fn validate(x: &CpuActivations, run: &Run<'_>, out: &CpuActivations) -> Result<(), KernelError> {
    let bad = |detail: String| Err(KernelError::Shape { op: "lora", detail });
    if x.rows != out.rows {
        return bad(format!("x is {} but out is {}", x.shape(), out.shape()));
    }
    if run.rows.start > run.rows.end || run.rows.end > x.rows {
        return bad(format!("rows {:?} of {} rows", run.rows, x.rows));
    }
    if run.rank == 0 || run.rank > MAX_RANK {
        return bad(format!("rank {} is outside 1..={MAX_RANK}", run.rank));
    }
    if run.a.values.len() != run.rank * x.cols {
        return bad(format!(
            "A holds {} values, not rank {} × input {}",
            run.a.values.len(),
            run.rank,
            x.cols
        ));
    }
    if run.b_t.values.len() != run.rank * out.cols {
        return bad(format!(
            "Bᵀ holds {} values, not rank {} × output {}",
            run.b_t.values.len(),
            run.rank,
            out.cols
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// Every ISA against the scalar twin: the expand is bit for bit (one
    /// fused multiply-add per term, in order, on every ISA); the shrink's
    /// dot products sum in SIMD lanes, so they agree to float rounding of
    /// a sum of `in` products of magnitude ≤ 1 (relative 1e-5 of the
    /// update's size is far above that rounding and far below any real
    /// difference).
    #[test]
    fn simd_matches_scalar_and_rows_are_independent() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (k, width, n) = (96, 80, 13);
        let x = CpuActivations::from_values(n, k, &random(&mut rng, n * k)).unwrap();
        let base = random(&mut rng, n * width);
        let adapters: Vec<(CpuVector, CpuVector, usize)> = [4usize, 16, 1]
            .iter()
            .map(|&rank| {
                let a = CpuVector {
                    values: random(&mut rng, rank * k),
                };
                let b_t = CpuVector {
                    values: random(&mut rng, rank * width),
                };
                (a, b_t, rank)
            })
            .collect();
        let spans = [(0..3, 0), (3..4, 1), (5..12, 2), (12..13, 0)];
        let runs: Vec<Run<'_>> = spans
            .iter()
            .map(|(rows, i)| Run {
                rows: rows.clone(),
                a: &adapters[*i].0,
                b_t: &adapters[*i].1,
                rank: adapters[*i].2,
                scale: 0.5,
            })
            .collect();
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let pool = ThreadPool::new(3);
            let mut out = CpuActivations::from_values(n, width, &base).unwrap();
            lora(&pool, isa, &x, &runs, &mut out).unwrap();
            for r in 0..n {
                let mut want = base[r * width..(r + 1) * width].to_vec();
                if let Some((_, i)) = spans.iter().find(|(rows, _)| rows.contains(&r)) {
                    let (a, b_t, _) = &adapters[*i];
                    let xr = x.row(r).unwrap();
                    lora_row_scalar(xr, &a.values, &b_t.values, 0.5, &mut want);
                }
                let got = out.row(r).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{isa:?} row {r}");
                }
                // Row 4 belongs to no run: untouched, bit for bit.
                if r == 4 {
                    assert_eq!(got, &base[4 * width..5 * width]);
                }
            }
            // One row alone gets the bits it got in the mixed call.
            let mut alone =
                CpuActivations::from_values(1, width, &base[5 * width..6 * width]).unwrap();
            let x5 = CpuActivations::from_values(1, k, x.row(5).unwrap()).unwrap();
            let one = [Run {
                rows: 0..1,
                a: &adapters[2].0,
                b_t: &adapters[2].1,
                rank: adapters[2].2,
                scale: 0.5,
            }];
            lora(&pool, isa, &x5, &one, &mut alone).unwrap();
            assert_eq!(alone.row(0), out.row(5), "{isa:?}");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let isa = CheckedIsa::at_most(Isa::Scalar);
        let x = CpuActivations::zeros(2, 8);
        let mut out = CpuActivations::zeros(2, 4);
        let a = CpuVector {
            values: vec![0.0; 16],
        };
        let b_t = CpuVector {
            values: vec![0.0; 7],
        };
        let run = |rows, rank| Run {
            rows,
            a: &a,
            b_t: &b_t,
            rank,
            scale: 1.0,
        };
        assert!(lora(&pool, isa, &x, &[run(0..2, 2)], &mut out).is_err());
        assert!(lora(&pool, isa, &x, &[run(0..3, 2)], &mut out).is_err());
        assert!(lora(&pool, isa, &x, &[run(0..2, 0)], &mut out).is_err());
    }
}
