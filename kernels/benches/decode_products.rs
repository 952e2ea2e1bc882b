//! One-row weight products (single-stream decode) of the real models'
//! shapes, per quant type, each against a plain read of as many bytes on
//! as many threads in the same round: how much of a read of its own bytes
//! each product reaches.
//!
//! Gemma 3 270M Q4_K_M: the tied head (Q8_0), q/k/gate/up (Q5_0), v
//! (Q8_0), attn_output (Q4_K), ffn_down (Q6_K, Q4_K in some layers);
//! SmolLM2-135M Q4_1: its Q4_1 layers and Q8_0 head. Each product runs
//! through the backend's `matmul` on one activation row, as a decode step
//! calls it (the row's quantization and the pool's dispatch included),
//! with its weights
//!
//! - `l2`: a set of copies of the matrix of at least 1 MB (one copy of a
//!   larger matrix), read again and again: the kernel's own rate where
//!   the L2 serves it;
//! - `l3`: copies of at least 16 MB: what a decode step's weights, which
//!   the host's L3 mostly holds, are served from;
//! - `dram`: copies of at least 512 MB, cycled through: past the L3.
//!
//! Each round, per thread count and set: a plain AVX-512 read of as many
//! bytes as the set (the roofline program's kernel), the products for at
//! least 200 ms, the read again; the product's share is of the two reads'
//! mean. GB/s count the checkpoint's bytes (as the roofline's step bytes
//! do), though the repacked Q6_K streams a third more (`packed/`).
//!
//! `cargo bench -p switchyard-kernels --bench decode_products -- [filter] [rounds]`
//! (`filter` a substring of `model/product`, e.g. `gemma3/down`; `all` or
//! nothing for every shape; rounds default 3).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "plain_read/mod.rs"]
mod plain_read;

use std::time::{Duration, Instant};

use bytes::Bytes;
use plain_read::{plain_read, spread};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, CpuMatrix};
use switchyard_kernels::{Backend, DType, WeightView};

/// A product of one decode step: `rows × k` weights of `dtype`, and how
/// many of them a step runs (for the step-weighted line).
struct Shape {
    model: &'static str,
    name: &'static str,
    dtype: DType,
    rows: usize,
    k: usize,
    per_step: usize,
}

const fn shape(
    model: &'static str,
    name: &'static str,
    dtype: DType,
    rows: usize,
    k: usize,
    per_step: usize,
) -> Shape {
    Shape {
        model,
        name,
        dtype,
        rows,
        k,
        per_step,
    }
}

/// The real models' products (counts from `gguf-dump` of the two files).
const SHAPES: [Shape; 13] = [
    shape("gemma3", "head", DType::Q8_0, 262_144, 640, 1),
    shape("gemma3", "q", DType::Q5_0, 1024, 640, 18),
    shape("gemma3", "k", DType::Q5_0, 256, 640, 18 + 9),
    shape("gemma3", "v", DType::Q8_0, 256, 640, 9),
    shape("gemma3", "o", DType::Q4K, 640, 1024, 18),
    shape("gemma3", "gate_up", DType::Q5_0, 2048, 640, 36),
    shape("gemma3", "down", DType::Q6K, 640, 2048, 9),
    shape("gemma3", "down_q4k", DType::Q4K, 640, 2048, 9),
    shape("smollm2", "head", DType::Q8_0, 49_152, 576, 1),
    shape("smollm2", "q_o", DType::Q4_1, 576, 576, 60),
    shape("smollm2", "k_v", DType::Q4_1, 192, 576, 60),
    shape("smollm2", "gate_up", DType::Q4_1, 1536, 576, 60),
    shape("smollm2", "down", DType::Q4_1, 576, 1536, 30),
];

const SETS: [(&str, usize); 3] = [("l2", 1 << 20), ("l3", 16 << 20), ("dram", 512 << 20)];
const MIN_MEASURED: Duration = Duration::from_millis(200);
/// Bytes each timing of the plain read covers at least.
const MIN_READ_BYTES: usize = 2_000_000_000;

fn arg(i: usize) -> Option<String> {
    std::env::args().filter(|a| !a.starts_with('-')).nth(i)
}

/// The matrix `copies` times over (each packed on its own, as a model's
/// layers are).
fn copies(backend: &CpuBackend, s: &Shape, bytes: &Bytes, set: usize) -> Vec<CpuMatrix> {
    let n = set.div_ceil(bytes.len()).max(1);
    (0..n)
        .map(|_| {
            let view = WeightView::new(s.dtype, s.rows, s.k, bytes.clone()).expect("whole blocks");
            backend.matrix(view).expect("a CPU matrix")
        })
        .collect()
}

/// GB/s (checkpoint bytes) of one-row products over `set`, in order, for
/// at least [`MIN_MEASURED`] and one pass.
fn products(backend: &CpuBackend, set: &[CpuMatrix], x: &CpuActivations, bytes: usize) -> f64 {
    let rows = set.first().map_or(0, |w| w.rows());
    let mut y = backend.activations(1, rows);
    let start = Instant::now();
    let mut calls = 0usize;
    while calls < set.len() || start.elapsed() < MIN_MEASURED {
        for w in set {
            backend.matmul(x, w, None, &mut y).expect("matmul");
        }
        calls += set.len();
    }
    (calls * bytes) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Per set and thread count: (bytes a step, seconds a step at the median).
type StepTotals = [[(f64, f64); 2]; SETS.len()];

#[derive(Default)]
struct Series {
    product: Vec<f64>,
    read: Vec<f64>,
    share: Vec<f64>,
}

fn main() {
    let filter = arg(1).filter(|f| f != "all").unwrap_or_default();
    let rounds: usize = arg(2).and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let backends = [CpuBackend::new(1), CpuBackend::new(2)];
    println!(
        "one-row products, {} rounds, ISA {}, GB/s of checkpoint bytes: median (range)",
        rounds,
        backends[0].isa()
    );
    let mut rng = common::rng(11);
    // Per model: (bytes a step, seconds a step at the median) per set and thread count.
    let mut step: Vec<(&str, StepTotals)> = Vec::new();
    for s in SHAPES
        .iter()
        .filter(|s| format!("{}/{}", s.model, s.name).contains(&filter))
    {
        let bytes = Bytes::from(common::random_weights(&mut rng, s.dtype, s.rows, s.k));
        let x = CpuActivations::from_values(1, s.k, &common::random_activations(&mut rng, 1, s.k))
            .expect("one row");
        let sets = SETS.map(|(place, at_least)| (place, copies(&backends[0], s, &bytes, at_least)));
        let reads: Vec<Vec<u8>> = sets
            .iter()
            .map(|(_, set)| vec![1u8; set.len() * bytes.len()])
            .collect();
        let mut series: Vec<Series> = (0..2 * SETS.len()).map(|_| Series::default()).collect();
        for _ in 0..rounds {
            for (ti, backend) in backends.iter().enumerate() {
                for (si, (_, set)) in sets.iter().enumerate() {
                    let threads = ti + 1;
                    let before = plain_read(&reads[si], threads, MIN_READ_BYTES);
                    let gbs = products(backend, set, &x, bytes.len());
                    let after = plain_read(&reads[si], threads, MIN_READ_BYTES);
                    let read = (before + after) / 2.0;
                    let out = &mut series[2 * si + ti];
                    out.product.push(gbs);
                    out.read.push(read);
                    out.share.push(100.0 * gbs / read);
                }
            }
        }
        let at = match step.iter().position(|(m, _)| *m == s.model) {
            Some(i) => i,
            None => {
                step.push((s.model, [[(0.0, 0.0); 2]; SETS.len()]));
                step.len() - 1
            }
        };
        for (si, (place, set)) in sets.iter().enumerate() {
            for ti in 0..2 {
                let out = &series[2 * si + ti];
                let mut sorted = out.product.clone();
                sorted.sort_by(f64::total_cmp);
                let median = sorted[sorted.len() / 2];
                let call_us = bytes.len() as f64 / median / 1e3;
                let step_bytes = (s.per_step * bytes.len()) as f64;
                let (b, t) = &mut step[at].1[si][ti];
                *b += step_bytes;
                *t += step_bytes / (median * 1e9);
                println!(
                    "{:>7}/{:<8} {:>4} {:>5}x{:<4} {:>5} {:>6.1} MB t{}  product {}  read {}  share % {}  ({:.1} us a call)",
                    s.model,
                    s.name,
                    s.dtype,
                    s.rows,
                    s.k,
                    place,
                    (set.len() * bytes.len()) as f64 / 1e6,
                    ti + 1,
                    spread(out.product.clone()),
                    spread(out.read.clone()),
                    spread(out.share.clone()),
                    call_us,
                );
            }
        }
    }
    for (model, by_set) in step {
        for (si, (place, _)) in SETS.iter().enumerate() {
            for (ti, (b, t)) in by_set[si].iter().enumerate() {
                println!(
                    "{model} step's products measured above, {place}, t{}: {:.1} MB in {:.2} ms, {:.1} GB/s",
                    ti + 1,
                    b / 1e6,
                    t * 1e3,
                    b / t / 1e9
                );
            }
        }
    }
}
