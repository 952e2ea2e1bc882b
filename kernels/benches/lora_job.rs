//! The LoRA job alone (`Backend::lora_many` / `lora`), as one decode step
//! of SmolLM2-135M calls it: 30 layers, each with its four LoRA calls (Q, K
//! and V in one job; O; gate and up in one job; down), 16 rows, rank-8 BF16
//! (or Q8_0) adapters on all seven projections. No base matmul runs beside it, so its
//! rate can be read against the machine's: arithmetic (`2 · rank · (in +
//! out)` flops a row a projection, 78 MFLOP a step) and adapter bytes.
//!
//! Configurations: the 16 rows on 1 adapter (one run) or on 16 (a run a
//! row), each hot (every layer's calls read layer 0's matrices: 1 adapter
//! is 164 KB, in L2) or cold (each layer its own: 1 adapter 4.9 MB, 16
//! adapters 78 MB, the serving case), on 1 and 2 threads. Configurations
//! alternate within each round; each prints the median over rounds of
//! ms per step, GFLOP/s and adapter GB/s (the bytes of the adapters the
//! step reads, each once).
//!
//! `cargo bench -p switchyard-kernels --bench lora_job -- [rounds]` (default 7);
//! `SWITCHYARD_LORA_DTYPE=q8_0` (the engine's variable) for Q8_0 adapters.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, CpuMatrix};
use switchyard_kernels::{Backend, DType, LoraRows, LoraSide, LoraUpdate, WeightView};

const ROWS: usize = 16;
const RANK: usize = 8;
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;
const INNER: usize = 1536;
/// Each measurement repeats steps until it has this much time.
const MIN_MEASURED: Duration = Duration::from_millis(200);

/// (input, output) of the seven projections, in the step's order: Q, K, V,
/// O, gate, up, down.
const PROJECTIONS: [(usize, usize); 7] = [
    (HIDDEN, HIDDEN),
    (HIDDEN, KV),
    (HIDDEN, KV),
    (HIDDEN, HIDDEN),
    (HIDDEN, INNER),
    (HIDDEN, INNER),
    (INNER, HIDDEN),
];

/// One adapter's `A` and `Bᵀ` for each projection of one layer.
type Layer = Vec<(CpuMatrix, CpuMatrix)>;

/// The adapters' type: BF16, or Q8_0 where `SWITCHYARD_LORA_DTYPE=q8_0`.
fn adapter_dtype() -> DType {
    match std::env::var("SWITCHYARD_LORA_DTYPE").as_deref() {
        Ok("q8_0") => DType::Q8_0,
        _ => DType::BF16,
    }
}

fn matrix(
    backend: &CpuBackend,
    rng: &mut impl Rng,
    (dtype, side): (DType, LoraSide),
    rows: usize,
    cols: usize,
) -> CpuMatrix {
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-0.1f32..0.1))
        .collect();
    let bytes: Vec<u8> = match dtype {
        DType::Q8_0 => switchyard_kernels::formats::quantize::quantize(dtype, &values)
            .expect("Q8_0 quantizes whole blocks"),
        _ => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
    };
    let view =
        WeightView::new(dtype, rows, cols, Bytes::from(bytes)).expect("bytes of the stated shape");
    backend.lora_matrix(view, side).expect("an adapter matrix")
}

fn layer(backend: &CpuBackend, rng: &mut impl Rng, dtype: DType) -> Layer {
    PROJECTIONS
        .iter()
        .map(|&(input, output)| {
            (
                matrix(backend, rng, (dtype, LoraSide::Shrink), RANK, input),
                matrix(backend, rng, (dtype, LoraSide::Expand), RANK, output),
            )
        })
        .collect()
}

/// The step's activations: inputs (normed, attention, gated) and outputs.
struct Buffers {
    normed: CpuActivations,
    attn: CpuActivations,
    gated: CpuActivations,
    outs: Vec<CpuActivations>,
}

/// One step: for each layer, the step's four LoRA calls, all rows on the
/// one adapter or row `r` on adapter `r`; `hot` reads layer 0's matrices
/// at every layer.
fn step(backend: &CpuBackend, adapters: &[Vec<Layer>], hot: bool, buf: &mut Buffers) {
    let n = adapters.len();
    let rows_of = |a: usize| -> std::ops::Range<usize> {
        if n == 1 {
            0..ROWS
        } else {
            a..a + 1
        }
    };
    for l in 0..LAYERS {
        let layer = if hot { 0 } else { l };
        let runs: Vec<Vec<LoraRows<'_, CpuBackend>>> = (0..7)
            .map(|p| {
                (0..n)
                    .map(|a| {
                        let (m_a, m_b) = &adapters[a][layer][p];
                        LoraRows {
                            rows: rows_of(a),
                            a: m_a,
                            b_t: m_b,
                            scale: 2.0,
                        }
                    })
                    .collect()
            })
            .collect();
        let [q, k, v, o, gate, up, down] = &mut buf.outs[..] else {
            unreachable!("seven outputs")
        };
        let update = |p: usize, out| LoraUpdate {
            runs: &runs[p],
            out,
        };
        let mut qkv = [update(0, q), update(1, k), update(2, v)];
        backend
            .lora_many(&buf.normed, &mut qkv)
            .expect("updates shaped like their inputs");
        backend
            .lora(&buf.attn, &runs[3], o)
            .expect("updates shaped like their inputs");
        let mut gate_up = [update(4, gate), update(5, up)];
        backend
            .lora_many(&buf.normed, &mut gate_up)
            .expect("updates shaped like their inputs");
        backend
            .lora(&buf.gated, &runs[6], down)
            .expect("updates shaped like their inputs");
    }
}

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(7)
        .max(1);
    let mut rng = common::rng(35);
    let builder = CpuBackend::new(1);
    let dtype = adapter_dtype();
    // adapters[a][layer][projection]
    let adapters: Vec<Vec<Layer>> = (0..ROWS)
        .map(|_| {
            (0..LAYERS)
                .map(|_| layer(&builder, &mut rng, dtype))
                .collect()
        })
        .collect();
    let act = |rng: &mut rand_chacha::ChaCha8Rng, cols| {
        CpuActivations::from_values(ROWS, cols, &common::random_activations(rng, ROWS, cols))
            .expect("values of the stated shape")
    };
    let mut buf = Buffers {
        normed: act(&mut rng, HIDDEN),
        attn: act(&mut rng, HIDDEN),
        gated: act(&mut rng, INNER),
        outs: PROJECTIONS
            .iter()
            .map(|&(_, output)| CpuActivations::zeros(ROWS, output))
            .collect(),
    };
    let flops_per_step: f64 = PROJECTIONS
        .iter()
        .map(|&(i, o)| 2.0 * (RANK * (i + o)) as f64)
        .sum::<f64>()
        * (ROWS * LAYERS) as f64;
    let bytes_row = |cols| dtype.bytes_for(cols).expect("a width the type stores") as f64;
    let adapter_bytes_layer: f64 = PROJECTIONS
        .iter()
        .map(|&(i, o)| RANK as f64 * (bytes_row(i) + bytes_row(o)))
        .sum();
    let backends = [CpuBackend::new(1), CpuBackend::new(2)];
    // (label, threads index, adapters, hot)
    let mut configs = Vec::new();
    for (t, threads) in [(0usize, 1usize), (1, 2)] {
        for count in [1usize, 16] {
            for hot in [true, false] {
                let label = format!(
                    "{count:>2} adapter(s), {}, {threads} thread(s)",
                    if hot { "hot " } else { "cold" }
                );
                configs.push((label, t, count, hot));
            }
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for c in 0..configs.len() {
            // Alternate the order so that no configuration always follows
            // the same one.
            let c = if round % 2 == 0 {
                c
            } else {
                configs.len() - 1 - c
            };
            let (_, t, count, hot) = &configs[c];
            let backend = &backends[*t];
            let set = &adapters[..*count];
            step(backend, set, *hot, &mut buf);
            let started = Instant::now();
            let mut steps = 0u32;
            while started.elapsed() < MIN_MEASURED {
                step(backend, set, *hot, &mut buf);
                steps += 1;
            }
            times[c].push(started.elapsed().as_secs_f64() / f64::from(steps));
        }
    }
    println!(
        "LoRA job alone: {ROWS} rows, rank {RANK} {dtype}, {LAYERS} layers x 7 projections, \
         {:.1} MFLOP/step, median of {rounds} rounds",
        flops_per_step / 1e6
    );
    println!(
        "{:<36} {:>9} {:>9} {:>12}",
        "configuration", "ms/step", "GFLOP/s", "adapter GB/s"
    );
    for ((label, _, count, _), t) in configs.iter().zip(&mut times) {
        t.sort_by(f64::total_cmp);
        let median = t[t.len() / 2];
        // Bytes the step reads from the adapters: each adapter's matrices
        // once a layer (hot: the same layer's again each layer).
        let bytes = adapter_bytes_layer * (*count as f64) * LAYERS as f64;
        println!(
            "{label:<36} {:>9.3} {:>9.1} {:>12.2}",
            median * 1e3,
            flops_per_step / median / 1e9,
            bytes / median / 1e9
        );
    }
}
