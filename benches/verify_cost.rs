//! What a speculative verify step costs against a plain decode step: one
//! sequence at depth `DEPTH` runs its last token plus `k` drafted tokens
//! as `k + 1` rows (every row's logits, as `speculate::verify` needs them)
//! for k = 0 (a plain step: one row, the last row's logits), 1, 2, 3, 4, 6,
//! 8, 12, 16, 24, 32, 48 and 64 (the larger ones: where AMX starts to pay, see
//! `matmul.rs`'s `AMX_MIN_ROWS`). Each round times every `k` back to back, in alternating order, so
//! each ratio to k = 0 compares measurements seconds apart under the same
//! load; the report gives per-round ratios' medians and ranges.
//!
//! These ratios turn an acceptance pattern into a speedup: a step that
//! keeps `a` of `k` drafted tokens emits `a + 1` tokens for `cost(k)` of a
//! plain step (`benches/speculation_ceiling.py` takes them as input).
//!
//! `cargo bench --bench verify_cost -- [rounds]` (default 9); the model is
//! `SWITCHYARD_MODEL` (default SmolLM2-135M Q4_1), threads from
//! `SWITCHYARD_BENCH_THREADS` (default 2). Prints a Markdown table and one
//! JSON line (`{"k": [...], "cost": [...]}`).

#[path = "support/batched.rs"]
#[allow(dead_code)]
mod batched;
#[path = "support/device.rs"]
mod device;
#[path = "support/rounds.rs"]
mod rounds;

use std::sync::Arc;
use std::time::{Duration, Instant};

use batched::{load_model, threads};
use device::on_bench_device;
use rounds::{rounds_arg, summary};
use switchyard_engine::kv::{KvBlocks, KvPool, SequenceKv};
use switchyard_engine::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::{Backend, KvPrefix, KvType};

/// Drafted tokens per verify step measured (0: a plain decode step).
const DRAFTS: [usize; 13] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];
/// Tokens in the cache before the timed steps: a retrieval prompt and
/// part of its answer.
const DEPTH: usize = 256;
/// Each measurement repeats steps until it has this much step time.
const MIN_MEASURED: Duration = Duration::from_millis(200);

fn main() {
    let rounds = rounds_arg(9);
    let seconds = on_bench_device(threads(), Rounds(rounds));
    report(&seconds, threads());
}

/// `rounds` interleaved rounds: `seconds[round][k index]`, one step's time.
struct Rounds(usize);

impl OnDevice for Rounds {
    type Output = Vec<[f64; DRAFTS.len()]>;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output {
        rounds_on(&*backend, self.0)
    }
}

fn rounds_on<B: Backend>(backend: &B, rounds: usize) -> Vec<[f64; DRAFTS.len()]> {
    let model = load_model(backend);
    let mut scratch = model.new_scratch(backend);
    let kv = KvPool::unlimited(KvType::F16);
    let blocks = KvBlocks::new(backend, &kv).expect("a KV store");
    let capacity = DEPTH + DRAFTS[DRAFTS.len() - 1] + 1;
    let mut cache = SequenceKv::for_model(backend, &blocks, &model, capacity, KvPrefix::none())
        .expect("a cache for one sequence");
    let vocab = model.config().vocab_size as u32;
    let tokens: Vec<u32> = (0..capacity as u32)
        .map(|i| 100 + (i * 7919) % (vocab - 200))
        .collect();
    step(
        backend,
        &model,
        &mut scratch,
        &blocks,
        &mut cache,
        &tokens,
        0,
        DEPTH,
    );
    // Warm-up: page the weights in and grow the scratch to the widest step.
    for &k in &DRAFTS {
        step(
            backend,
            &model,
            &mut scratch,
            &blocks,
            &mut cache,
            &tokens,
            DEPTH,
            k + 1,
        );
    }
    let mut seconds = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..DRAFTS.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut per_step = [0.0; DRAFTS.len()];
        for i in order {
            let rows = DRAFTS[i] + 1;
            let (mut elapsed, mut runs) = (Duration::ZERO, 0u32);
            while elapsed < MIN_MEASURED {
                // The same positions again, as a verify step after a
                // rejected draft writes over the rolled-back ones.
                elapsed += step(
                    backend,
                    &model,
                    &mut scratch,
                    &blocks,
                    &mut cache,
                    &tokens,
                    DEPTH,
                    rows,
                );
                runs += 1;
            }
            per_step[i] = elapsed.as_secs_f64() / f64::from(runs);
        }
        eprintln!(
            "round {round}: {}",
            DRAFTS
                .iter()
                .zip(per_step)
                .map(|(k, s)| format!("k{k} {:.2} ms", s * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
        seconds.push(per_step);
    }
    seconds
}

/// Runs `tokens[at..at + rows]` at positions `at..` and returns the time
/// of the forward pass: a plain step (the last row's logits) for one row,
/// a verify step (every row's) for more.
#[allow(clippy::too_many_arguments)]
fn step<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    scratch: &mut Scratch<B>,
    blocks: &Arc<KvBlocks<B>>,
    cache: &mut SequenceKv<B>,
    tokens: &[u32],
    at: usize,
    rows: usize,
) -> Duration {
    let logits = if rows == 1 || at == 0 {
        LogitRows::Last
    } else {
        LogitRows::All
    };
    let started = Instant::now();
    let mut chunk = [SequenceChunk {
        tokens: &tokens[at..at + rows],
        start_pos: at,
        table: cache.prepare(backend, at..at + rows).expect("blocks"),
        logits,
        prompt: false,
    }];
    model
        .forward(backend, &mut blocks.lock(), &mut chunk, scratch)
        .expect("a forward step");
    let elapsed = started.elapsed();
    cache.truncate(DEPTH).expect("rolling back to the depth");
    elapsed
}

fn report(seconds: &[[f64; DRAFTS.len()]], threads: usize) {
    println!(
        "| drafted k | rows | step ms median (range) | cost over a plain step, median of rounds (range) |"
    );
    println!("| --- | --- | --- | --- |");
    let mut costs = Vec::with_capacity(DRAFTS.len());
    for (i, k) in DRAFTS.iter().enumerate() {
        let ms: Vec<f64> = seconds.iter().map(|s| s[i] * 1e3).collect();
        let ratio: Vec<f64> = seconds.iter().map(|s| s[i] / s[0]).collect();
        let (mm, mlo, mhi) = summary(&ms);
        let (rm, rlo, rhi) = summary(&ratio);
        costs.push(rm);
        println!(
            "| {k} | {} | {mm:.2} ({mlo:.2}-{mhi:.2}) | {rm:.2}x ({rlo:.2}-{rhi:.2}) |",
            k + 1
        );
    }
    println!(
        "\n{} rounds, {threads} threads, depth {DEPTH}.",
        seconds.len()
    );
    println!(
        "{}",
        serde_json::json!({ "k": DRAFTS, "cost": costs, "depth": DEPTH, "threads": threads })
    );
}
