//! `out = x · Wᵀ (+ bias)`: activation rows against weight rows, for one
//! matrix or several sharing the input (Q/K/V, gate/up).
//!
//! For quantized weights the activation rows are quantized once per call
//! (see `quant_act`), however many matrices take them. The work of every
//! matrix goes into one pool job as a list of tasks (see `plan`):
//! repacked matrices (`packed`) split into runs of 16-row groups, the rest
//! (and a repacked matrix's tail rows) into runs of rows for the per-row
//! kernels. Each task walks the activation rows a tile at a time, so a
//! weight block that sits in L1 serves the whole tile before the next one
//! is loaded: the cache blocking that makes prompt processing and batched
//! decode cheaper than `n` matrix-vector products.

use std::cell::RefCell;
use std::ops::Range;

use smallvec::SmallVec;

use super::disjoint::DisjointSlice;
use super::dot::{dot_float, dot_quantized, tile_rows};
use super::isa::CheckedIsa;
use super::matmul_input::Input;
#[cfg(target_arch = "x86_64")]
use super::packed::amx::{AmxRows, AMX_ROWS};
use super::packed::{PackedRows, GROUP_ROWS};
use super::quant_act::{QRow, QuantizedRows, SharedRows};
use super::tensors::{CpuActivations, CpuMatrix};
use super::threads::ThreadPool;
use crate::KernelError;

thread_local! {
    /// What a call builds and drops again, reused so that a matmul does not
    /// allocate: at decode the caller's allocations between two jobs
    /// (the task list grew by doubling, call after call) are time the
    /// worker spends idle.
    static SCRATCH: RefCell<CallScratch> = RefCell::new(CallScratch::default());
}

/// A quantized call's buffers (see [`SCRATCH`]).
#[derive(Default)]
struct CallScratch {
    /// The quantized activations.
    rows: QuantizedRows,
    /// The call's tasks (see [`plan`]).
    tasks: Vec<Task>,
}

/// Products of one call held without an allocation: Q/K/V is three.
/// Filled in place (`new`, then `extend`): a collected list is returned
/// by value, a `memcpy` call of its whole inline buffer.
pub(crate) type ProductList<T> = SmallVec<[T; 4]>;

/// Tasks of a matrix come from [`ThreadPool::guided_ranges`]: a few large
/// ones first, then smaller ones that even out the threads' finishing
/// times. Sixteen equal small tasks per thread (the first design, so that
/// a preempted worker held back little) measured 7% slower at batch 1 and
/// 16 on two threads (14% at batch 4, 17% on the AVX2 per-row path) in
/// paired runs, and no faster on one thread: with small tasks the threads
/// take turns along a matrix, so neither reads its weights as one
/// sequential stream. A preempted worker now holds back up to half a
/// matrix, against the scheduler's time slice it lost.
const MIN_ROWS_PER_TASK: usize = 8;
/// A group is 16 rows; two make a task worth its atomic.
const MIN_GROUPS_PER_TASK: usize = 2;
/// At most this many groups (1,024 rows) per task, so that the first tasks
/// of the 49,152-row output matrix do not hold half of it each.
const MAX_GROUPS_PER_TASK: usize = 64;
const MAX_ROWS_PER_TASK: usize = MAX_GROUPS_PER_TASK * GROUP_ROWS;
/// Weight rows per per-row kernel call within a task (outputs buffered on
/// the stack).
const SUB_CHUNK_ROWS: usize = 64;
/// Activation rows per group-kernel call: at 16 a batch of 16 sequences
/// unpacks each weight block once instead of twice. Sixteen accumulators,
/// eight unpacked weight vectors and the block's scales nearly fill
/// AVX-512's 32 registers, and LLVM keeps a few accumulators on the stack
/// (one store and one reload each per block, against ~180 vector ops per
/// block); batch 16 still measured ~10% faster than with tiles of 8.
const GROUP_TILE: usize = 16;
/// Weight bytes of the groups a task runs all activation tiles over before
/// moving on: a quarter of a 1 MB L2, so each tile streams them from L2
/// while its own rows stay in L1. Blocks that fit L1 (24 KB) made every
/// tile start over on each few groups and measured 7-15% slower in prompt
/// processing on Zen 5 (SmolLM2 and Gemma 3, prompts of 128 and 512).
const GROUP_BLOCK_BYTES: usize = 256 * 1024;

/// One product of a [`matmul_many`] call.
pub(crate) struct Product<'a> {
    pub(crate) w: &'a CpuMatrix,
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) out: &'a mut CpuActivations,
    /// `out +=` instead of `out =`.
    pub(crate) accumulate: bool,
}

pub(crate) fn matmul(
    pool: &ThreadPool,
    isa: CheckedIsa,
    x: &CpuActivations,
    w: &CpuMatrix,
    bias: Option<&[f32]>,
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    let product = Product {
        w,
        bias,
        out,
        accumulate: false,
    };
    matmul_many(pool, isa, Input::Rows(x), &mut [product])
}

/// Every product on the rows of `input`. When every weight is quantized,
/// one pool job does it all: its first phase makes the input's rows (the
/// elementwise step, if any) and quantizes them, a few rows per task; its
/// second runs the products' tasks. Float weights read f32 rows, so with
/// any of them the step runs first as a job of its own.
pub(crate) fn matmul_many(
    pool: &ThreadPool,
    isa: CheckedIsa,
    input: Input<'_>,
    products: &mut [Product<'_>],
) -> Result<(), KernelError> {
    input.validate()?;
    let (n, k) = input.shape();
    for p in products.iter() {
        validate(n, k, p)?;
    }
    if products.iter().all(|p| p.w.dtype().is_quantized()) {
        run_quantized(pool, isa, input, products);
        return Ok(());
    }
    let x = input.finish(pool, isa)?;
    for p in products.iter_mut().filter(|p| !p.w.dtype().is_quantized()) {
        matmul_float(pool, isa, x, p);
    }
    let mut quantized: ProductList<Product<'_>> = products
        .iter_mut()
        .filter(|p| p.w.dtype().is_quantized())
        .map(|p| Product {
            w: p.w,
            bias: p.bias,
            out: &mut *p.out,
            accumulate: p.accumulate,
        })
        .collect();
    if !quantized.is_empty() {
        run_quantized(pool, isa, Input::Rows(x), &mut quantized);
    }
    Ok(())
}

/// First-phase tasks per thread: enough that both threads share the step
/// and the quantization, few enough that each is worth its atomic.
const ROW_TASKS_PER_THREAD: usize = 4;

/// The one job of [`matmul_many`] for quantized weights (validated).
fn run_quantized(
    pool: &ThreadPool,
    isa: CheckedIsa,
    input: Input<'_>,
    products: &mut [Product<'_>],
) {
    let (n, k) = input.shape();
    let mut targets = ProductList::new();
    targets.extend(products.iter_mut().map(|p| Target {
        w: p.w,
        bias: p.bias,
        accumulate: p.accumulate,
        out: DisjointSlice::new(&mut p.out.data),
    }));
    let steps = input.by_rows(isa);
    let rows_per_task = pool.chunk_for(n, ROW_TASKS_PER_THREAD, 1);
    let run = |scratch: &mut CallScratch| {
        let CallScratch { rows, tasks } = scratch;
        plan(pool, &targets, n, tasks);
        let tasks = &*tasks;
        let q = rows.shared(isa, n, k);
        let amx = AmxTiles::default();
        pool.run_phased(
            n.div_ceil(rows_per_task),
            &|i| {
                for r in i * rows_per_task..((i + 1) * rows_per_task).min(n) {
                    // SAFETY: each first-phase task makes and quantizes its
                    // own rows; nothing reads them before the second phase.
                    unsafe { q.quantize_row(r, steps.row(r)) };
                }
            },
            tasks.len(),
            &|i| {
                let task = &tasks[i];
                let target = &targets[task.target];
                match &task.unit {
                    Unit::Groups(groups) => {
                        if let Some(packed) = &target.w.packed {
                            run_groups(isa, packed, target, &q, &amx, n, groups.clone());
                        }
                    }
                    Unit::Rows(rows) => run_rows(isa, target, &q, n, rows.clone()),
                }
            },
        );
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut q) => run(&mut q),
        // Only a nested matmul on this thread gets here; it pays for its
        // own buffers.
        Err(_) => run(&mut CallScratch::default()),
    });
}

/// Checks product `p` against input rows of `n × k`.
fn validate(n: usize, k: usize, p: &Product<'_>) -> Result<(), KernelError> {
    let (w, out) = (p.w, &p.out);
    if k != w.cols() || out.rows != n || out.cols != w.rows() {
        return Err(KernelError::Shape {
            op: "matmul",
            detail: format!(
                "x is {n}×{k}, W is {}×{} ({}), out is {}; need x n×{1}, out n×{0}",
                w.rows(),
                w.cols(),
                w.dtype(),
                out.shape()
            ),
        });
    }
    if let Some(bias) = p.bias {
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
    Ok(())
}

/// A quantized product as the tasks see it.
struct Target<'a> {
    w: &'a CpuMatrix,
    bias: Option<&'a [f32]>,
    accumulate: bool,
    out: DisjointSlice<'a, f32>,
}

enum Unit {
    /// 16-row groups of a repacked matrix.
    Groups(Range<usize>),
    /// Weight rows in the checkpoint's layout.
    Rows(Range<usize>),
}

struct Task {
    target: usize,
    unit: Unit,
}

/// Activation rows from which a matrix's whole tiles of [`AMX_ROWS`] go
/// through AMX. Each group is unpacked for AMX once per task and its tile
/// products wait on `tileloadd` and `tdpbssd` latencies, a cost per group
/// that only several tiles share: below this, the VNNI tiles are faster
/// (SmolLM2's 17-, 25- and 33-row steps 24%, 18% and 12% faster without
/// AMX, `cargo bench --bench verify_cost`, docs/bench/speculation.md), so
/// a 16-sequence decode step and a long verify step stay on VNNI while
/// prompt chunks take AMX. `SWITCHYARD_AMX_MIN_ROWS` overrides it (to
/// measure).
#[cfg(target_arch = "x86_64")]
const AMX_MIN_ROWS: usize = 64;

#[cfg(target_arch = "x86_64")]
fn amx_min_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    super::knob::usize_or(&ROWS, "SWITCHYARD_AMX_MIN_ROWS", AMX_MIN_ROWS, |_| true)
}

/// Activation rows from which the group kernels take a repacked matrix: 1,
/// i.e. always. Results must not depend on batch composition (the engine
/// checks that a sequence decodes the same alone or batched, to 1e-3 in
/// log-probability), and the group and per-row kernels round in different
/// f32 orders, which int8 activation rounding amplifies; so a repacked
/// matrix always takes the group kernels. The cost: at one row, on weights
/// streaming from DRAM, the group kernels measured slower than the per-row
/// ones (the 30 MB output matrix 4.6 ms against 3.0 ms, see BENCHMARKS.md).
const GROUP_MIN_ROWS: usize = 1;

/// The call's activation tiles in AMX order (`AmxRows`), built by the
/// first tasks that take a matrix on AMX and shared by the rest: copied
/// per task (guided scheduling makes many small ones), the copies cost
/// more than the tile order saved.
#[cfg(target_arch = "x86_64")]
type AmxTiles = std::sync::OnceLock<Option<Vec<AmxRows>>>;
#[cfg(not(target_arch = "x86_64"))]
type AmxTiles = ();

/// Splits every target's output rows into `tasks` (emptied first): its
/// groups (if repacked and `n` rows make them pay), then the rows no group
/// covers.
fn plan(pool: &ThreadPool, targets: &[Target<'_>], n: usize, tasks: &mut Vec<Task>) {
    tasks.clear();
    for (i, t) in targets.iter().enumerate() {
        let packed = t.w.packed.as_ref().filter(|_| n >= GROUP_MIN_ROWS);
        let groups = packed.map_or(0, |p| p.groups());
        let groups = pool.guided_ranges(0..groups, MIN_GROUPS_PER_TASK, MAX_GROUPS_PER_TASK);
        let (first, rows) = (packed.map_or(0, |p| p.rows()), t.w.rows());
        let rows = pool.guided_ranges(first..rows, MIN_ROWS_PER_TASK, MAX_ROWS_PER_TASK);
        tasks.extend(groups.map(|g| Task {
            target: i,
            unit: Unit::Groups(g),
        }));
        tasks.extend(rows.map(|r| Task {
            target: i,
            unit: Unit::Rows(r),
        }));
    }
}

/// The group kernels over `groups`, activation rows a tile at a time.
fn run_groups(
    isa: CheckedIsa,
    packed: &PackedRows,
    t: &Target<'_>,
    q: &SharedRows<'_>,
    amx: &AmxTiles,
    n: usize,
    groups: Range<usize>,
) {
    // Groups a block at a time (a quarter of L2's worth of weights), each
    // block meeting every activation tile before the next is loaded: a
    // task's whole range (up to ~1 MB of the output matrix) would be
    // streamed again from L3 or DRAM for every tile.
    let block = (GROUP_BLOCK_BYTES / packed.group_bytes()).max(1);
    let mut start = groups.start;
    while start < groups.end {
        let end = (start + block).min(groups.end);
        run_group_block(isa, packed, t, q, amx, n, start..end);
        start = end;
    }
}

/// Every activation tile against `groups`.
fn run_group_block(
    isa: CheckedIsa,
    packed: &PackedRows,
    t: &Target<'_>,
    q: &SharedRows<'_>,
    amx: &AmxTiles,
    n: usize,
    groups: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    let mut first = run_amx(isa, packed, t, q, amx, n, groups.clone());
    #[cfg(not(target_arch = "x86_64"))]
    let mut first = {
        let () = *amx;
        0
    };
    // Fewer than eight rows left (a speculative verify step's 2-9 rows, a
    // prompt's tail) take one tile of their own size: each tile is a pass
    // over the weights' unpacking, and 7 rows as 4 + 2 + 1 paid three.
    while first < n {
        let count = match n - first {
            GROUP_TILE.. => GROUP_TILE,
            8.. => 8,
            left => left,
        };
        let groups = groups.clone();
        match count {
            GROUP_TILE => run_tile::<GROUP_TILE>(isa, packed, t, q_rows(q, first), first, groups),
            8 => run_tile::<8>(isa, packed, t, q_rows(q, first), first, groups),
            7 => run_tile::<7>(isa, packed, t, q_rows(q, first), first, groups),
            6 => run_tile::<6>(isa, packed, t, q_rows(q, first), first, groups),
            5 => run_tile::<5>(isa, packed, t, q_rows(q, first), first, groups),
            4 => run_tile::<4>(isa, packed, t, q_rows(q, first), first, groups),
            3 => run_tile::<3>(isa, packed, t, q_rows(q, first), first, groups),
            2 => run_tile::<2>(isa, packed, t, q_rows(q, first), first, groups),
            _ => run_tile::<1>(isa, packed, t, q_rows(q, first), first, groups),
        }
        first += count;
    }
}

/// On AMX, from [`AMX_MIN_ROWS`] rows, the whole tiles of [`AMX_ROWS`]
/// activation rows against `groups`, a group at a time: each group is
/// unpacked once and meets every tile (see `packed::amx`). Returns the
/// rows done (the rest take the VNNI tiles: same results bit for bit).
#[cfg(target_arch = "x86_64")]
fn run_amx(
    isa: CheckedIsa,
    packed: &PackedRows,
    t: &Target<'_>,
    q: &SharedRows<'_>,
    amx: &AmxTiles,
    n: usize,
    groups: Range<usize>,
) -> usize {
    let rows = n / AMX_ROWS * AMX_ROWS;
    if rows == 0 || n < amx_min_rows() || !packed.takes_amx(isa) {
        return 0;
    }
    let q_tiles: Vec<[QRow<'_>; AMX_ROWS]> = (0..rows)
        .step_by(AMX_ROWS)
        .map(|first| q_rows(q, first))
        .collect();
    if amx.get().is_none() {
        // Built here without waiting for another task that builds them
        // too (a task blocked in `get_or_init` measured tens of
        // milliseconds per call on this loaded 2-vCPU host): at most one
        // copy per thread, the first one set kept.
        let _ = amx.set(q_tiles.iter().map(AmxRows::new).collect());
    }
    let Some(Some(tiles)) = amx.get() else {
        return 0;
    };
    for g in groups {
        let ran = packed.with_amx_group(isa, g, |u| {
            for (i, rows) in tiles.iter().enumerate() {
                let first = i * AMX_ROWS;
                let bases = out_bases(t, first, g..g + 1);
                // SAFETY: this task owns group g's outputs in every row.
                unsafe {
                    finish_group(t, bases, 0, g, |outs, accumulate| {
                        if packed.amx_fits(u, rows) {
                            packed.dot_group_amx(u, rows, outs, accumulate);
                        } else {
                            let tile = packed.tile(&q_tiles[i]);
                            packed.dot_group(isa, g, &tile, outs, accumulate);
                        }
                    })
                };
            }
        });
        if ran.is_none() {
            // This thread's scratch is lent (a nested matmul): the VNNI
            // tiles, which give the same sums.
            for first in (0..rows).step_by(AMX_ROWS) {
                run_tile::<AMX_ROWS>(isa, packed, t, q_rows(q, first), first, g..g + 1);
            }
        }
    }
    rows
}

/// Activation rows `first..first + C` (`tile`) against `groups`.
fn run_tile<const C: usize>(
    isa: CheckedIsa,
    packed: &PackedRows,
    t: &Target<'_>,
    activations: [QRow<'_>; C],
    first: usize,
    groups: Range<usize>,
) {
    // The rows' widths are checked here, once per tile, not per group.
    let tile = packed.tile(&activations);
    let bases = out_bases(t, first, groups.clone());
    for (i, g) in groups.enumerate() {
        // SAFETY: group `i` of the span of `bases`.
        unsafe {
            finish_group(t, bases, i, g, |outs, accumulate| {
                packed.dot_group::<C>(isa, g, &tile, outs, accumulate)
            })
        };
    }
}

/// Each tile row's outputs for all of `groups`, bounds-checked once here
/// rather than per group (a check per row and group showed in profiles);
/// every access goes through these pointers.
fn out_bases<const C: usize>(t: &Target<'_>, first: usize, groups: Range<usize>) -> [*mut f32; C] {
    let rows = t.w.rows();
    let span = groups.len() * GROUP_ROWS;
    std::array::from_fn(|r| {
        let start = (first + r) * rows + groups.start * GROUP_ROWS;
        // SAFETY: each task owns the output columns of its groups in
        // every activation row.
        unsafe { t.out.range(start, span).as_mut_ptr() }
    })
}

/// Group `g` (the `i`-th of `bases`' span) of `kernel`'s sums into the
/// outputs: `kernel(outs, accumulate)` writes (or adds) its sixteen sums
/// per row, and this adds the bias.
///
/// # Safety
/// As [`group_outs`] for `bases` and `i`.
unsafe fn finish_group<const C: usize>(
    t: &Target<'_>,
    bases: [*mut f32; C],
    i: usize,
    g: usize,
    kernel: impl FnOnce([&mut [f32; GROUP_ROWS]; C], bool),
) {
    // SAFETY: the caller's promise; the arrays are used one at a time.
    let outs = || unsafe { group_outs(bases, i) };
    let bias = t.bias.map(|b| &b[g * GROUP_ROWS..(g + 1) * GROUP_ROWS]);
    // A bias before a residual add rounds as `x + (dot + bias)`: through
    // a buffer. (No model here has both on one matrix.)
    if t.accumulate && t.bias.is_some() {
        let mut sums = [[0.0f32; GROUP_ROWS]; C];
        kernel(sums.each_mut(), false);
        let bias = bias.unwrap_or(&[0.0; GROUP_ROWS]);
        for (o, sums) in outs().into_iter().zip(&sums) {
            for ((o, v), b) in o.iter_mut().zip(sums).zip(bias) {
                *o += v + b;
            }
        }
        return;
    }
    kernel(outs(), t.accumulate);
    if let Some(bias) = bias {
        for o in outs() {
            o.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
        }
    }
}

/// Group `i`'s sixteen outputs in each row from `bases`.
///
/// # Safety
/// Each base points at least `16 · (i + 1)` floats this task alone
/// accesses, and no other borrow of them lives while the result does.
unsafe fn group_outs<'a, const C: usize>(
    bases: [*mut f32; C],
    i: usize,
) -> [&'a mut [f32; GROUP_ROWS]; C] {
    // SAFETY: the caller's promise.
    std::array::from_fn(|r| unsafe { &mut *bases[r].add(i * GROUP_ROWS).cast() })
}

/// Stores `value` at `index` of `out`, or adds it with `accumulate`.
///
/// # Safety
/// No other task may read or write `index` during this job.
unsafe fn store(out: &DisjointSlice<'_, f32>, accumulate: bool, index: usize, value: f32) {
    if accumulate {
        // SAFETY: the caller's promise.
        unsafe { out.range(index, 1)[0] += value };
    } else {
        // SAFETY: the caller's promise.
        unsafe { out.write(index, value) };
    }
}

/// The per-row kernels over weight rows `range` (see [`walk_tiles`]).
fn run_rows(isa: CheckedIsa, t: &Target<'_>, q: &SharedRows<'_>, n: usize, range: Range<usize>) {
    let (dtype, rows) = (t.w.dtype(), t.w.rows());
    let data: &[u8] = &t.w.view.data;
    let row_bytes = t.w.view.row_bytes();
    let dot = |first: usize, count: usize, weights: Range<usize>, o: &mut [f32]| {
        let w = &data[weights.start * row_bytes..weights.end * row_bytes];
        match count {
            8 => dot_quantized::<8>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
            4 => dot_quantized::<4>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
            2 => dot_quantized::<2>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
            _ => dot_quantized::<1>(isa, dtype, w, row_bytes, &q_rows(q, first), o),
        }
    };
    let store = |row: usize, first: usize, values: &[f32]| {
        let add = t.bias.map_or(0.0, |b| b[row]);
        for (r, v) in values.iter().enumerate() {
            // SAFETY: each task owns the output column `row` of every
            // activation row.
            unsafe { store(&t.out, t.accumulate, (first + r) * rows + row, v + add) };
        }
    };
    walk_tiles(n, tile_rows(isa), range, dot, store);
}

/// Float weights (F32, F16, BF16) against the f32 activations, split by
/// weight rows as `run_rows` splits quantized ones.
fn matmul_float(pool: &ThreadPool, isa: CheckedIsa, x: &CpuActivations, p: &mut Product<'_>) {
    let (w, bias, accumulate) = (p.w, p.bias, p.accumulate);
    let (n, k, rows) = (x.rows, x.cols, w.rows());
    let dtype = w.dtype();
    let data: &[u8] = &w.view.data;
    let row_bytes = w.view.row_bytes();
    let out = DisjointSlice::new(&mut p.out.data);
    let tile = tile_rows(isa);
    let xs = |first: usize| x.data.get(first * k..).unwrap_or_default();
    let ranges: Vec<Range<usize>> = pool
        .guided_ranges(0..rows, MIN_ROWS_PER_TASK, MAX_ROWS_PER_TASK)
        .collect();
    pool.run(ranges.len(), &|task| {
        let range = ranges[task].clone();
        let dot = |first: usize, count: usize, weights: Range<usize>, o: &mut [f32]| {
            let w = &data[weights.start * row_bytes..weights.end * row_bytes];
            match count {
                8 => dot_float::<8>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
                4 => dot_float::<4>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
                2 => dot_float::<2>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
                _ => dot_float::<1>(isa, dtype, w, row_bytes, &float_rows(xs(first), k), o),
            }
        };
        let store = |row: usize, first: usize, values: &[f32]| {
            let add = bias.map_or(0.0, |b| b[row]);
            for (r, v) in values.iter().enumerate() {
                // SAFETY: each task owns the output column `row` of every
                // activation row.
                unsafe { store(&out, accumulate, (first + r) * rows + row, v + add) };
            }
        };
        walk_tiles(n, tile, range, dot, store);
    });
}

/// Walks `n` activation rows a tile at a time (whole tiles of `tile` rows,
/// then tiles of 4, 2 and 1 while they fit: each tile is a pass over the
/// weight rows, so a verify step's 7 rows take three passes, not seven) against weight rows `range` in sub-chunks whose
/// outputs fit a stack buffer, so the tile (a few KB) and the sub-chunk's
/// weights stay in L1 while they meet. `dot(first, count, weight_rows, out)`
/// fills `count` outputs per weight row; `store(row, first, values)` takes
/// weight row `row`'s outputs for activation rows `first..`.
fn walk_tiles(
    n: usize,
    tile: usize,
    range: Range<usize>,
    dot: impl Fn(usize, usize, Range<usize>, &mut [f32]),
    store: impl Fn(usize, usize, &[f32]),
) {
    let mut buffer = [0.0f32; SUB_CHUNK_ROWS * 8];
    let mut first = 0;
    while first < n {
        let left = n - first;
        let count = [tile, 4, 2, 1]
            .into_iter()
            .find(|&c| c <= tile && c <= left)
            .unwrap_or(1);
        let mut start = range.start;
        while start < range.end {
            let end = (start + SUB_CHUNK_ROWS).min(range.end);
            let o = &mut buffer[..(end - start) * count];
            dot(first, count, start..end, o);
            for (row, values) in (start..end).zip(o.chunks_exact(count)) {
                store(row, first, values);
            }
            start = end;
        }
        first += count;
    }
}

/// `R` consecutive rows of width `k` from the start of `xs`.
fn float_rows<const R: usize>(xs: &[f32], k: usize) -> [&[f32]; R] {
    std::array::from_fn(|i| &xs[i * k..(i + 1) * k])
}

/// Quantized rows `first..first + R`, read in a job's second phase.
fn q_rows<'q, const R: usize>(q: &'q SharedRows<'_>, first: usize) -> [QRow<'q>; R] {
    // SAFETY: the job's first phase quantized every row and has finished;
    // the second phase only reads them.
    std::array::from_fn(|i| unsafe { q.row(first + i) })
}
