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
//! (half the bytes of F32; tiled at upload, see `lora_elems`), widened to
//! f32 in registers (the products and sums stay f32; rows of one run are
//! taken up to four at a time, so each load of `A` serves them all), or
//! Q8_0 (about a quarter, packed at upload for integer dot products, a
//! row at a time: see `lora_q8`). A row's arithmetic never
//! depends on the task or the group it falls in, so a row's result is the
//! same whichever rows share its step.

use std::ops::Range;

use super::disjoint::DisjointSlice;
use super::isa::CheckedIsa;
use super::lora_expand::{expand, expands};
use super::lora_q8;
use super::lora_q8_operands::{QuantMid, QuantRow, QUAD};
use super::lora_shrink::shrink;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::{DType, KernelError, WeightView};

/// Rows one item takes (a decode step's run is often one row; a prompt's
/// many).
const ROWS_PER_ITEM: usize = 8;

/// Rows of one run that share each load of `A` in the shrink.
const GROUP: usize = 4;

/// Tasks per pool thread: items are spread over this many tasks a thread,
/// enough to even out runs of unequal cost, few enough that each task has
/// several items to pipeline (see [`lora_many`]).
const TASKS_PER_THREAD: usize = 4;

/// The largest rank a run may have (as the engine's loader allows).
pub(crate) const MAX_RANK: usize = 256;

/// One run of rows and its adapter's tensors (see `LoraRows`): `a` is
/// `rank × in`, `b_t` is `rank × out`, F32, BF16 or Q8_0.
pub(crate) struct Run<'a> {
    pub(crate) rows: Range<usize>,
    pub(crate) a: &'a WeightView,
    pub(crate) b_t: &'a WeightView,
    pub(crate) scale: f32,
}

/// The runs of one output that reads the call's input (one of Q, K and V,
/// or of gate and up, which read the same normed rows).
pub(crate) struct Update<'a, 'o> {
    pub(crate) runs: &'a [Run<'a>],
    pub(crate) out: &'o mut CpuActivations,
}

/// `out[rows] += scale · (x[rows] · Aᵀ) · Bᵀ` for every run.
pub(crate) fn lora(
    pool: &ThreadPool,
    isa: CheckedIsa,
    x: &CpuActivations,
    runs: &[Run<'_>],
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    lora_many(pool, isa, x, &mut [Update { runs, out }])
}

/// [`lora`] for several outputs of the same input in one pool job.
///
/// A decode step's update is memory-bound: sixteen rows on sixteen
/// adapters read sixteen adapters' `A` and `Bᵀ` (a few KB each, cold since
/// the last step), and a short stream read in order waits on DRAM before
/// the hardware prefetcher catches on. So the items (a run's rows against
/// one output) are cut into a few tasks per thread, and each task asks for
/// its next item's bytes while it computes the current one's: the misses
/// overlap the arithmetic instead of following it. One job for Q, K and V
/// (or gate and up) also saves the pool's start and join per output.
pub(crate) fn lora_many(
    pool: &ThreadPool,
    isa: CheckedIsa,
    x: &CpuActivations,
    updates: &mut [Update<'_, '_>],
) -> Result<(), KernelError> {
    for update in updates.iter() {
        for run in update.runs {
            validate(x, run, update.out)?;
        }
    }
    let k = x.cols;
    // (output, run, rows): the rows of one run for one output, the
    // outputs of the same rows side by side (their `x` rows stay in cache).
    let mut items: Vec<(usize, usize, Range<usize>)> = Vec::new();
    for (u, update) in updates.iter().enumerate() {
        for (i, run) in update.runs.iter().enumerate() {
            let rows = run.rows.clone();
            for s in rows.clone().step_by(ROWS_PER_ITEM) {
                items.push((u, i, s..(s + ROWS_PER_ITEM).min(rows.end)));
            }
        }
    }
    items.sort_by_key(|(u, _, rows)| (rows.start, *u));
    if items.is_empty() {
        return Ok(());
    }
    let per_task = items
        .len()
        .div_ceil(pool.threads().max(1) * TASKS_PER_THREAD)
        .max(1);
    // (The runs are borrowed for their own lifetime, not through `updates`.)
    let runs: Vec<&[Run<'_>]> = updates.iter().map(|u| u.runs).collect();
    let targets: Vec<(DisjointSlice<'_, f32>, usize)> = updates
        .iter_mut()
        .map(|u| {
            let width = u.out.cols;
            (DisjointSlice::new(&mut u.out.data), width)
        })
        .collect();
    let run_of = |item: &(usize, usize, Range<usize>)| &runs[item.0][item.1];
    pool.run(items.len().div_ceil(per_task), &|task| {
        let mine = &items[task * per_task..((task + 1) * per_task).min(items.len())];
        if let Some(first) = mine.first() {
            prefetch_run(run_of(first));
        }
        // The group's dot products (`rank` rows of up to GROUP), then one
        // row's scaled `rank`.
        let mut sums = [0.0f32; MAX_RANK * GROUP];
        let mut mid = [0.0f32; MAX_RANK];
        let (mut qx, mut qp) = (QuantRow::default(), QuantMid::default());
        // The row `qx` holds: the outputs of one row (Q, K and V) are
        // items side by side, and quantize it once.
        let mut quantized: Option<usize> = None;
        for (n, item) in mine.iter().enumerate() {
            if let Some(next) = mine.get(n + 1) {
                prefetch_run(run_of(next));
            }
            let (u, _, rows) = item;
            let run = run_of(item);
            let (target, width) = &targets[*u];
            let rank = run.a.rows;
            if run.a.dtype == DType::Q8_0 {
                // Integer dot products on both sides (see `lora_q8`), a
                // row at a time.
                for r in rows.clone() {
                    if quantized != Some(r) {
                        qx.fill(isa, &x.data[r * k..(r + 1) * k]);
                        quantized = Some(r);
                    }
                    lora_q8::shrink(isa, &run.a.data, rank, &qx, &mut mid[..rank]);
                    for m in &mut mid[..rank] {
                        *m *= run.scale;
                    }
                    // SAFETY: as below.
                    let row = unsafe { target.range(r * width, *width) };
                    lora_q8::expand(isa, &mid[..rank], &run.b_t.data, &mut qp, row);
                }
                continue;
            }
            for start in rows.clone().step_by(GROUP) {
                let group = start..(start + GROUP).min(rows.end);
                let mut xs: [&[f32]; GROUP] = [&[]; GROUP];
                for (slot, r) in xs.iter_mut().zip(group.clone()) {
                    *slot = &x.data[r * k..(r + 1) * k];
                }
                let xs = &xs[..group.len()];
                shrink(isa, run.a.dtype, &run.a.data, rank, xs, &mut sums);
                for (g, r) in group.clone().enumerate() {
                    for (j, m) in mid[..rank].iter_mut().enumerate() {
                        *m = sums[j * group.len() + g] * run.scale;
                    }
                    // SAFETY: an output's runs are disjoint (checked in
                    // `validate` to lie inside it, and the caller's
                    // contract), and each (output, row) is one item's.
                    let row = unsafe { target.range(r * width, *width) };
                    expand(isa, run.b_t.dtype, &mid[..rank], &run.b_t.data, row);
                }
            }
        }
    });
    Ok(())
}

/// Asks for every cache line of a run's `A` and `Bᵀ` into L2 (a hint: no
/// effect on results, never faults). L2, not L1: the next item's bytes
/// (up to ~35 KB at rank 8) beside the current one's would not fit L1.
fn prefetch_run(run: &Run<'_>) {
    for data in [&run.a.data[..], &run.b_t.data[..]] {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            let start = data.as_ptr().cast::<i8>();
            for offset in (0..data.len()).step_by(64) {
                // SAFETY: SSE is part of x86_64; a prefetch reads nothing
                // the program sees and cannot fault. The address is inside
                // `data`.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(offset)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = data;
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
    // Q8_0 matrices are `lora_q8`'s packed layout on both sides (see
    // `Backend::lora_matrix`): rows padded to its groups of four.
    if (a.dtype == DType::Q8_0) != (b_t.dtype == DType::Q8_0)
        || (a.dtype == DType::Q8_0 && !rank.is_multiple_of(QUAD))
    {
        return bad(format!(
            "A is {} and Bᵀ {} of rank {rank}: Q8_0 goes on both, packed by lora_matrix",
            a.dtype, b_t.dtype
        ));
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
    use crate::LoraSide;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// `values` as a `rows × cols` view of `dtype` as `lora_matrix`
    /// stores it for `side` (F32, BF16 rounded to nearest and tiled, or
    /// Q8_0 packed), and the values it holds, widened back (F32 and BF16
    /// only: Q8_0 results are checked against `lora_q8`'s twins).
    fn view(
        dtype: DType,
        side: LoraSide,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> (WeightView, Vec<f32>) {
        if dtype == DType::Q8_0 {
            let bytes = crate::formats::quantize::quantize(dtype, values)
                .expect("Q8_0 quantizes whole blocks");
            let view = WeightView::new(dtype, rows, cols, bytes::Bytes::from(bytes))
                .expect("bytes of the stated shape");
            return (
                lora_q8::pack(side, &view).expect("a Q8_0 matrix"),
                Vec::new(),
            );
        }
        let (bytes, held) = crate::cpu::lora_expand::tests::stored(dtype, cols, values);
        let view = WeightView::new(dtype, rows, cols, bytes::Bytes::from(bytes))
            .expect("bytes of the stated shape");
        (view, held)
    }

    /// One row's update as the scalar twins compute it: `lora_row_scalar`
    /// on the held values, or `lora_q8`'s twins on packed Q8_0 matrices.
    fn row_twin(
        dtype: DType,
        x: &[f32],
        (a, a_held): &(WeightView, Vec<f32>),
        (b_t, b_held): &(WeightView, Vec<f32>),
        scale: f32,
        out: &mut [f32],
    ) {
        if dtype != DType::Q8_0 {
            return lora_row_scalar(x, a_held, b_held, scale, out);
        }
        let mut qx = QuantRow::default();
        qx.fill(CheckedIsa::at_most(Isa::Scalar), x);
        let mut mid = vec![0.0f32; a.rows];
        lora_q8::shrink_scalar(&a.data, a.rows, &qx, &mut mid);
        for m in &mut mid {
            *m *= scale;
        }
        let mut qp = QuantMid::default();
        qp.fill(&mid);
        lora_q8::expand_scalar(&qp, &b_t.data, out);
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
        let x = CpuActivations::from_values(n, k, &random(&mut rng, n * k))
            .expect("values of the stated shape");
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
                .map(|(a, b_t, rank)| {
                    (
                        view(dtype, LoraSide::Shrink, *rank, k, a),
                        view(dtype, LoraSide::Expand, *rank, width, b_t),
                    )
                })
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
                let mut out = CpuActivations::from_values(n, width, &base)
                    .expect("values of the stated shape");
                lora(&pool, isa, &x, &runs, &mut out).expect("an update shaped like the input");
                for r in 0..n {
                    let mut want = base[r * width..(r + 1) * width].to_vec();
                    if let Some((_, i)) = spans.iter().find(|(rows, _)| rows.contains(&r)) {
                        let (a, b_t) = &adapters[*i];
                        let x = x.row(r).expect("a row of the batch");
                        row_twin(dtype, x, a, b_t, 0.5, &mut want);
                    }
                    let got = out.row(r).expect("a row of the batch");
                    if dtype == DType::Q8_0 {
                        // The twins' bits (`lora_q8`: the same integer sums
                        // and f32 operations on every ISA).
                        assert_eq!(got, &want[..], "{isa:?} {dtype} row {r}");
                    }
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
                            .expect("values of the stated shape");
                    let xr =
                        CpuActivations::from_values(1, k, x.row(r).expect("a row of the batch"))
                            .expect("values of the stated shape");
                    let one = [Run {
                        rows: 0..1,
                        a: &adapters[2].0 .0,
                        b_t: &adapters[2].1 .0,
                        scale: 0.5,
                    }];
                    lora(&pool, isa, &xr, &one, &mut alone)
                        .expect("an update shaped like the input");
                    assert_eq!(alone.row(0), out.row(r), "{isa:?} {dtype} row {r}");
                }
            }
        }
    }

    /// One job for three outputs of the same input (as Q, K and V) gives
    /// each output the bits its own call gives, on every ISA and type,
    /// for decode runs of one row and a prompt run longer than an item;
    /// an output whose runs are empty is left alone.
    #[test]
    fn many_outputs_in_one_job_match_one_call_each() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (k, n) = (64, 21);
        let widths = [96usize, 32, 64];
        let x = CpuActivations::from_values(n, k, &random(&mut rng, n * k))
            .expect("values of the stated shape");
        let bases: Vec<Vec<f32>> = widths.iter().map(|w| random(&mut rng, n * w)).collect();
        for dtype in [DType::F32, DType::BF16, DType::Q8_0] {
            // Per output, two adapters of ranks 8 and 3.
            let adapters: Vec<Vec<(WeightView, WeightView)>> = widths
                .iter()
                .map(|&width| {
                    [8usize, 3]
                        .iter()
                        .map(|&rank| {
                            let a = view(
                                dtype,
                                LoraSide::Shrink,
                                rank,
                                k,
                                &random(&mut rng, rank * k),
                            )
                            .0;
                            let b_t = view(
                                dtype,
                                LoraSide::Expand,
                                rank,
                                width,
                                &random(&mut rng, rank * width),
                            )
                            .0;
                            (a, b_t)
                        })
                        .collect()
                })
                .collect();
            // Rows 0..1 and 2..3 decode; 4..21 a prompt (three items).
            let spans = [(0..1, 0), (2..3, 1), (4..21, 0)];
            let runs: Vec<Vec<Run<'_>>> = adapters
                .iter()
                .enumerate()
                .map(|(o, pair)| {
                    // The second output takes no update at all.
                    if o == 1 {
                        return Vec::new();
                    }
                    spans
                        .iter()
                        .map(|(rows, i)| Run {
                            rows: rows.clone(),
                            a: &pair[*i].0,
                            b_t: &pair[*i].1,
                            scale: 0.25,
                        })
                        .collect()
                })
                .collect();
            for isa in Isa::supported() {
                let isa = CheckedIsa::at_most(isa);
                let pool = ThreadPool::new(2);
                let mut outs: Vec<CpuActivations> = widths
                    .iter()
                    .zip(&bases)
                    .map(|(&w, b)| {
                        CpuActivations::from_values(n, w, b).expect("values of the stated shape")
                    })
                    .collect();
                let mut updates: Vec<Update<'_, '_>> = outs
                    .iter_mut()
                    .zip(&runs)
                    .map(|(out, runs)| Update { runs, out })
                    .collect();
                lora_many(&pool, isa, &x, &mut updates).expect("updates shaped like the input");
                for ((out, runs), (&w, base)) in
                    outs.iter().zip(&runs).zip(widths.iter().zip(&bases))
                {
                    let mut alone = CpuActivations::from_values(n, w, base)
                        .expect("values of the stated shape");
                    lora(&pool, isa, &x, runs, &mut alone)
                        .expect("an update shaped like the input");
                    assert_eq!(out.data, alone.data, "{isa:?} {dtype} width {w}");
                }
                assert_eq!(
                    outs[1].data, bases[1],
                    "{isa:?} {dtype}: no runs, untouched"
                );
            }
        }
    }

    /// An adapter's matrix is its view alone: a Q8_0 `A` of rank 16 (one
    /// whole group of rows) gets no packed copy for the matmul kernels,
    /// which would double its bytes unseen by the adapter budget, while
    /// the same rows as a model weight get one where the ISA packs.
    #[test]
    fn adapter_matrices_keep_no_packed_copy() {
        use crate::Backend;
        let backend = crate::cpu::CpuBackend::new(1);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let values = random(&mut rng, 16 * 64);
        let bytes = crate::formats::quantize::quantize(DType::Q8_0, &values)
            .expect("Q8_0 quantizes whole blocks");
        let a = WeightView::new(DType::Q8_0, 16, 64, bytes::Bytes::from(bytes))
            .expect("bytes of the stated shape");
        let weight = backend.matrix(a.clone()).expect("a supported weight");
        let packs = crate::cpu::packed::packs(backend.isa, DType::Q8_0);
        assert_eq!(weight.packed.is_some(), packs);
        let adapter = backend
            .lora_matrix(a.clone(), LoraSide::Shrink)
            .expect("a supported adapter matrix");
        assert!(adapter.packed.is_none());
        assert_eq!(adapter.view.data.len(), a.data.len());
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let isa = CheckedIsa::at_most(Isa::Scalar);
        let x = CpuActivations::zeros(2, 8);
        let mut out = CpuActivations::zeros(2, 4);
        let (a, _) = view(DType::F32, LoraSide::Shrink, 2, 8, &[0.0; 16]);
        let (b_t, _) = view(DType::F32, LoraSide::Shrink, 2, 4, &[0.0; 8]);
        let (b_short, _) = view(DType::F32, LoraSide::Shrink, 1, 4, &[0.0; 4]);
        let (a_wide, _) = view(DType::F32, LoraSide::Shrink, 2, 9, &[0.0; 18]);
        let (a_q4, _) = {
            let bytes = bytes::Bytes::from(vec![0u8; 2 * 18]);
            (
                WeightView::new(DType::Q4_0, 2, 32, bytes).expect("bytes of the stated shape"),
                (),
            )
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
        let (a0, _) = view(DType::F32, LoraSide::Shrink, 0, 8, &[]);
        let (b0, _) = view(DType::F32, LoraSide::Shrink, 0, 4, &[]);
        assert!(lora(&pool, isa, &x, &[run(0..2, &a0, &b0)], &mut out).is_err());
    }
}
