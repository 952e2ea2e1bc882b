//! F16 weights in steps of more than 32 rows under one captured step,
//! swapped between two checkpoints: cuBLAS's batched GEMM reads the
//! weight's address from the step's table when it runs
//! (`kernels/src/cuda/gemm_pointers.rs`), so the graph captured for one
//! checkpoint replays for the other. Each step runs eagerly and keyed;
//! keyed outputs must equal eager ones bit for bit with no divergence
//! (one capture, replays after), and both be within `TOL` of the CPU's.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::{CpuBackend, Isa};
use switchyard_kernels::cuda::{CudaBackend, CudaConfig};
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::{
    Backend, DType, KernelError, MatmulInput, MatmulProduct, StepKey, WeightView,
};

use super::{random_values, Check};

/// More than `DECODE_MAX_ROWS` (32): the cuBLAS path.
const ROWS: usize = 48;
const D: usize = 256;
const FF: usize = 512;
const VOCAB: usize = 128;
/// Relative to the largest CPU value: the GPU rounds the rows to F16
/// before the GEMM, the CPU does not.
const TOL: f32 = 1e-2;

struct Weights<B: Backend> {
    up: B::Matrix,
    down: B::Matrix,
}

fn matrix<B: Backend>(
    b: &B,
    dtype: DType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<B::Matrix, Box<dyn std::error::Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let bytes = quantize(dtype, &random_values(rows * cols, &mut rng, 0.1))?;
    Ok(b.matrix(WeightView::new(dtype, rows, cols, bytes.into())?)?)
}

fn checkpoint<B: Backend>(b: &B, seed: u64) -> Result<Weights<B>, Box<dyn std::error::Error>> {
    Ok(Weights {
        up: matrix(b, DType::F16, FF, D, seed)?,
        down: matrix(b, DType::F16, D, FF, seed + 1)?,
    })
}

/// A backend's side: the shared embedding and its activations, made
/// once (a replay's launches must find them where the capture's did).
struct Side<B: Backend> {
    embed: B::Matrix,
    x: B::Activations,
    h: B::Activations,
}

impl<B: Backend> Side<B> {
    fn new(b: &B) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Side {
            embed: matrix(b, DType::F32, VOCAB, D, 7)?,
            x: b.activations(ROWS, D),
            h: b.activations(ROWS, FF),
        })
    }
}

/// One step of `w`: `x = embed(tokens)`, `h = x · upᵀ`, `x += h · downᵀ`.
fn step<B: Backend>(
    b: &B,
    side: &mut Side<B>,
    w: &Weights<B>,
    tokens: &[u32],
    key: Option<StepKey>,
) -> Result<Vec<f32>, KernelError> {
    let Side { embed, x, h } = side;
    b.begin_step(key);
    let run = (|| -> Result<(), KernelError> {
        b.embed(&*embed, tokens, &mut *x)?;
        b.matmul_many(
            MatmulInput::Rows(&*x),
            &mut [MatmulProduct {
                w: &w.up,
                bias: None,
                out: &mut *h,
                accumulate: false,
            }],
        )?;
        b.matmul_many(
            MatmulInput::Rows(&*h),
            &mut [MatmulProduct {
                w: &w.down,
                bias: None,
                out: &mut *x,
                accumulate: true,
            }],
        )?;
        b.end_step()
    })();
    if let Err(e) = run {
        b.abort_step();
        return Err(e);
    }
    let mut staging = Vec::new();
    Ok(b.host_rows(&*x, &mut staging).to_vec())
}

fn rel_err(got: &[f32], expected: &[f32]) -> f32 {
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    got.iter()
        .zip(expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// See the module documentation: `steps` steps alternating the two
/// checkpoints under one key.
pub fn f16_swaps_over_32_rows(steps: usize) -> Check {
    let gpu = CudaBackend::open(CudaConfig::default())?;
    let cpu = CpuBackend::with_isa(1, Isa::Scalar);
    let (mut sg, mut sc) = (Side::new(&gpu)?, Side::new(&cpu)?);
    let gw = [checkpoint(&gpu, 11)?, checkpoint(&gpu, 23)?];
    let cw = [checkpoint(&cpu, 11)?, checkpoint(&cpu, 23)?];
    let key = Some(StepKey(0xF16));
    let before = gpu.graph_stats();
    let (mut differing, mut worst, mut reruns) = (0usize, 0f32, 0usize);
    for s in 0..steps {
        let c = s % 2;
        let tokens: Vec<u32> = (0..ROWS).map(|i| ((i * 7 + s) % VOCAB) as u32).collect();
        let eager = step(&gpu, &mut sg, &gw[c], &tokens, None)?;
        let keyed = match step(&gpu, &mut sg, &gw[c], &tokens, key) {
            Err(KernelError::StepDiverged(_)) => {
                reruns += 1;
                step(&gpu, &mut sg, &gw[c], &tokens, None)?
            }
            other => other?,
        };
        let oracle = step(&cpu, &mut sc, &cw[c], &tokens, None)?;
        differing += usize::from(keyed != eager);
        worst = worst.max(rel_err(&eager, &oracle));
    }
    let stats = gpu.graph_stats();
    let (captures, replays, divergences) = (
        stats.captures - before.captures,
        stats.replays - before.replays,
        stats.divergences - before.divergences,
    );
    let pass = differing == 0
        && worst <= TOL
        && captures == 1
        && divergences == 0
        && replays + 2 >= steps as u64;
    println!(
        "{{\"check\":\"f16_swaps_over_32_rows\",\"rows\":{ROWS},\"steps\":{steps},\"keyed_differing_from_eager\":{differing},\"max_rel_vs_cpu\":{worst:e},\"tolerance\":{TOL:e},\"captures\":{captures},\"replays\":{replays},\"divergences\":{divergences},\"reruns\":{reruns},\"pass\":{pass}}}"
    );
    Ok(pass)
}
