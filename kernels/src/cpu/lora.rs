//! LoRA updates for the rows of a mixed batch (the SGMV idea on the CPU):
//! each run of rows takes its adapter's shrink (`x · Aᵀ`, `rank` dot
//! products of the input width) and expand (`rank` scaled adds of rows of
//! `Bᵀ` into the output row), on top of the base product already there.
//!
//! The base's matrix multiplies run once for every row of a step; only
//! this low-rank part is per adapter. Its cost per row is
//! `2 · rank · (in + out)` flops, a few percent of the base's for ranks
//! up to 64, but its bytes are the adapter's own: sixteen decode rows on
//! sixteen adapters read sixteen adapters. So `A` and `Bᵀ` may be BF16
//! (half the bytes of F32), widened to f32 in registers: the products and
//! sums stay f32. Rows of one run are taken up to four at a time, so each
//! load of `A` serves them all. Rows are spread over the pool in pieces of
//! one run; a row's arithmetic never depends on the piece or the group it
//! falls in, so a row's result is the same whichever rows share its step.

use std::ops::Range;

use super::disjoint::DisjointSlice;
use super::dot::dot_float;
use super::isa::CheckedIsa;
use super::lora_expand::{expand, expands};
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::{KernelError, WeightView};

/// Rows one task takes (a decode step's run is often one row; a prompt's
/// many).
const ROWS_PER_TASK: usize = 8;

/// Rows of one run that share each load of `A` in the shrink.
const GROUP: usize = 4;

/// The largest rank a run may have (as the engine's loader allows).
pub(crate) const MAX_RANK: usize = 256;

/// One run of rows and its adapter's tensors (see `LoraRows`): `a` is
/// `rank × in`, `b_t` is `rank × out`, both F32 or BF16.
pub(crate) struct Run<'a> {
    pub(crate) rows: Range<usize>,
    pub(crate) a: &'a WeightView,
    pub(crate) b_t: &'a WeightView,
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
    let exp = experiment();
    pool.run(tasks.len(), &|task| {
        let (i, rows) = &tasks[task];
        let run = &runs[*i];
        let rank = run.a.rows;
        if exp & 2 != 0 {
            super::prefetch::prefetch_all(&run.a.data[..]);
            super::prefetch::prefetch_all(&run.b_t.data[..]);
        }
        // The group's dot products (`rank` rows of up to GROUP), then one
        // row's scaled `rank`: sized to the rank, not to MAX_RANK.
        let mut buf = vec![0.0f32; rank * (GROUP + 1)];
        let (sums, mid) = buf.split_at_mut(rank * GROUP);
        for start in rows.clone().step_by(GROUP) {
            let group = start..(start + GROUP).min(rows.end);
            if exp & 1 != 0 || run.a.dtype == crate::DType::Q8_0 {
                let xs: Vec<&[f32]> = group.clone().map(|r| &x.data[r * k..(r + 1) * k]).collect();
                super::lora_shrink::shrink(isa, run.a.dtype, &run.a.data, rank, &xs, sums);
            } else {
                shrink(isa, x, k, run, group.clone(), sums);
            }
            for (g, r) in group.clone().enumerate() {
                for (j, m) in mid.iter_mut().enumerate() {
                    *m = sums[j * group.len() + g] * run.scale;
                }
                // SAFETY: runs' rows are disjoint (validated by the
                // caller's contract and checked in `validate` to lie
                // inside `out`), and each row belongs to one task.
                let row = unsafe { target.range(r * width, width) };
                expand(isa, run.b_t.dtype, mid, &run.b_t.data, row);
            }
        }
    });
    Ok(())
}

/// The A/B switch of the kernel variants under measurement
/// (`SWITCHYARD_LORA_EXP` bits: 1 the blocked shrink of `lora_shrink.rs`,
/// 2 a prefetch of each task's `A` and `Bᵀ`; default 0, the dot kernel).
/// Q8_0 adapters always take the blocked shrink (`dot_float` reads no
/// quantized rows). Results in docs/bench/lora.md; to be folded into one
/// path once a quiet run decides.
fn experiment() -> u32 {
    static EXP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EXP.get_or_init(|| {
        std::env::var("SWITCHYARD_LORA_EXP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// The shrink of rows `rows` (at most [`GROUP`]) of one run into `sums`:
/// `A`'s row `j` against the group's row `g` at `sums[j · n + g]` (`n`
/// rows). The dot kernel's sum for one row does not depend on how many
/// rows it takes at once.
fn shrink(
    isa: CheckedIsa,
    x: &CpuActivations,
    k: usize,
    run: &Run<'_>,
    rows: Range<usize>,
    sums: &mut [f32],
) {
    let rank = run.a.rows;
    let input = |r: usize| &x.data[r * k..(r + 1) * k];
    let (dtype, a) = (run.a.dtype, &run.a.data[..]);
    let row_bytes = a.len() / rank;
    let s = rows.start;
    match rows.len() {
        4 => dot_float::<4>(
            isa,
            dtype,
            a,
            row_bytes,
            &[input(s), input(s + 1), input(s + 2), input(s + 3)],
            &mut sums[..rank * 4],
        ),
        3 => dot_float::<3>(
            isa,
            dtype,
            a,
            row_bytes,
            &[input(s), input(s + 1), input(s + 2)],
            &mut sums[..rank * 3],
        ),
        2 => dot_float::<2>(
            isa,
            dtype,
            a,
            row_bytes,
            &[input(s), input(s + 1)],
            &mut sums[..rank * 2],
        ),
        _ => dot_float::<1>(isa, dtype, a, row_bytes, &[input(s)], &mut sums[..rank]),
    }
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
    super::vecmath::weighted_sum_scalar(&mid, b_t, out);
}

fn validate(x: &CpuActivations, run: &Run<'_>, out: &CpuActivations) -> Result<(), KernelError> {
    let bad = |detail: String| Err(KernelError::Shape { op: "lora", detail });
    if x.rows != out.rows {
        return bad(format!("x is {} but out is {}", x.shape(), out.shape()));
    }
    if run.rows.start > run.rows.end || run.rows.end > x.rows {
        return bad(format!("rows {:?} of {} rows", run.rows, x.rows));
    }
    let (a, b_t) = (run.a, run.b_t);
    let rank = a.rows;
    if rank == 0 || rank > MAX_RANK {
        return bad(format!("rank {rank} is outside 1..={MAX_RANK}"));
    }
    for (name, w) in [("A", a), ("Bᵀ", b_t)] {
        // The shrink and the expand read F32, BF16 and Q8_0 alike.
        if !expands(w.dtype) {
            return bad(format!("{name} is {}, not F32, BF16 or Q8_0", w.dtype));
        }
        // WeightView's fields are public: recheck the byte length the
        // kernels rely on.
        if w.dtype.bytes_for(w.cols).map(|b| b * w.rows) != Some(w.data.len()) {
            return bad(format!(
                "{name} holds {} bytes, not {} × {} {}",
                w.data.len(),
                w.rows,
                w.cols,
                w.dtype
            ));
        }
    }
    if a.cols != x.cols {
        return bad(format!(
            "A is {rank} × {}, not rank × input {}",
            a.cols, x.cols
        ));
    }
    if b_t.rows != rank || b_t.cols != out.cols {
        return bad(format!(
            "Bᵀ is {} × {}, not rank {rank} × output {}",
            b_t.rows, b_t.cols, out.cols
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;
    use crate::DType;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// `values` as a `rows × cols` view of `dtype` (F32, BF16 rounded to
    /// nearest, or Q8_0), and the values it holds, widened back.
    fn view(dtype: DType, rows: usize, cols: usize, values: &[f32]) -> (WeightView, Vec<f32>) {
        let (bytes, held) = crate::cpu::lora_expand::tests::stored(dtype, cols, values);
        let view = WeightView::new(dtype, rows, cols, bytes::Bytes::from(bytes)).unwrap();
        (view, held)
    }

    /// Every ISA and both types against the scalar twin on the values the
    /// view holds: the expand is bit for bit (one fused multiply-add per
    /// term, in order, on every ISA); the shrink's dot products sum in
    /// SIMD lanes, so they agree to float rounding of a sum of `in`
    /// products of magnitude ≤ 1 (relative 1e-5 of the update's size is
    /// far above that rounding and far below any real difference). Runs
    /// of 1 to 7 rows take every group size of the shrink.
    #[test]
    fn simd_matches_scalar_and_rows_are_independent() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (k, width, n) = (96, 96, 13);
        let x = CpuActivations::from_values(n, k, &random(&mut rng, n * k)).unwrap();
        let base = random(&mut rng, n * width);
        let raw: Vec<(Vec<f32>, Vec<f32>, usize)> = [4usize, 16, 1]
            .iter()
            .map(|&rank| {
                (
                    random(&mut rng, rank * k),
                    random(&mut rng, rank * width),
                    rank,
                )
            })
            .collect();
        for dtype in [DType::F32, DType::BF16, DType::Q8_0] {
            let adapters: Vec<_> = raw
                .iter()
                .map(|(a, b_t, rank)| (view(dtype, *rank, k, a), view(dtype, *rank, width, b_t)))
                .collect();
            let spans = [(0..3, 0), (3..4, 1), (5..12, 2), (12..13, 0)];
            let runs: Vec<Run<'_>> = spans
                .iter()
                .map(|(rows, i)| Run {
                    rows: rows.clone(),
                    a: &adapters[*i].0 .0,
                    b_t: &adapters[*i].1 .0,
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
                        let ((_, a), (_, b_t)) = &adapters[*i];
                        lora_row_scalar(x.row(r).unwrap(), a, b_t, 0.5, &mut want);
                    }
                    let got = out.row(r).unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                            "{isa:?} {dtype} row {r}"
                        );
                    }
                    // Row 4 belongs to no run: untouched, bit for bit.
                    if r == 4 {
                        assert_eq!(got, &base[4 * width..5 * width]);
                    }
                }
                // Each row of the seven-row run alone gets the bits it got
                // in the mixed call, whatever group it fell in there.
                for r in 5..12 {
                    let mut alone =
                        CpuActivations::from_values(1, width, &base[r * width..(r + 1) * width])
                            .unwrap();
                    let xr = CpuActivations::from_values(1, k, x.row(r).unwrap()).unwrap();
                    let one = [Run {
                        rows: 0..1,
                        a: &adapters[2].0 .0,
                        b_t: &adapters[2].1 .0,
                        scale: 0.5,
                    }];
                    lora(&pool, isa, &xr, &one, &mut alone).unwrap();
                    assert_eq!(alone.row(0), out.row(r), "{isa:?} {dtype} row {r}");
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let isa = CheckedIsa::at_most(Isa::Scalar);
        let x = CpuActivations::zeros(2, 8);
        let mut out = CpuActivations::zeros(2, 4);
        let (a, _) = view(DType::F32, 2, 8, &[0.0; 16]);
        let (b_t, _) = view(DType::F32, 2, 4, &[0.0; 8]);
        let (b_short, _) = view(DType::F32, 1, 4, &[0.0; 4]);
        let (a_wide, _) = view(DType::F32, 2, 9, &[0.0; 18]);
        let (a_q4, _) = {
            let bytes = bytes::Bytes::from(vec![0u8; 2 * 18]);
            (WeightView::new(DType::Q4_0, 2, 32, bytes).unwrap(), ())
        };
        let run = |rows, a, b_t| Run {
            rows,
            a,
            b_t,
            scale: 1.0,
        };
        assert!(lora(&pool, isa, &x, &[run(0..2, &a, &b_t)], &mut out).is_ok());
        assert!(lora(&pool, isa, &x, &[run(0..2, &a, &b_short)], &mut out).is_err());
        assert!(lora(&pool, isa, &x, &[run(0..3, &a, &b_t)], &mut out).is_err());
        assert!(lora(&pool, isa, &x, &[run(0..2, &a_wide, &b_t)], &mut out).is_err());
        let x32 = CpuActivations::zeros(2, 32);
        assert!(lora(&pool, isa, &x32, &[run(0..2, &a_q4, &b_t)], &mut out).is_err());
        let (a0, _) = view(DType::F32, 0, 8, &[]);
        let (b0, _) = view(DType::F32, 0, 4, &[]);
        assert!(lora(&pool, isa, &x, &[run(0..2, &a0, &b0)], &mut out).is_err());
    }
}
