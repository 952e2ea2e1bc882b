//! One decode step of 16 sequences over N LoRA adapters against the base
//! alone, measured without the server: the step's arithmetic only (no
//! admission, no HTTP), so that a gap in `benches/lora_serving.py` splits
//! into what the step costs and what serving adds.
//!
//! Each round times, back to back and in alternating order, the base alone
//! (one part of 16 chunks), 16 parts of one chunk without adapters (what
//! splitting the rows by checkpoint costs), and for each N the 16 sequences
//! spread over N adapters (sequence i on adapter i mod N, grouped into one
//! part per adapter as the executor groups them). It prints each
//! configuration's ms/step and the median of per-round ratios to the base:
//! the host's drift between minutes cancels in each round's ratio.
//!
//! `cargo bench --bench lora_step -- [rounds]` (default 9). Adapters are the
//! PEFT folders `a0`, `a1`, ... in `SWITCHYARD_LORA_DIR` (default
//! `/tmp/lora-work`, as `benches/lora_serving.py --work /tmp/lora-work
//! --prepare` writes them); `SWITCHYARD_LORA_COUNTS` (default `1,4,16`);
//! threads from `SWITCHYARD_BENCH_THREADS` (default 2); the adapters' type
//! from `SWITCHYARD_LORA_DTYPE` (`bf16`, `q8_0`, `f32`; see
//! `switchyard_engine::adapter::resident_dtype`). `SWITCHYARD_LORA_ONLY=I`
//! times only the table's configuration I (0 the base, 1 the 16 parts, 2
//! the first N), each slot of a round, for `perf record`.

#[allow(dead_code)]
#[path = "support/batched.rs"]
mod batched;
#[path = "support/device.rs"]
mod device;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batched::{load_model, model_path, prefilled, threads, PROMPT_TOKENS as PROMPT};
use device::on_bench_device;
use switchyard_engine::adapter::{load_adapter, ResidentAdapter};
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvBlocks, KvPool};
use switchyard_engine::model::{
    forward_step, LlamaModel, LogitRows, ModelPart, Scratch, SequenceChunk,
};
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::{Backend, KvType};

/// Sequences decoding together (the serving bench's 16 clients).
const SEQUENCES: usize = 16;
/// Decode steps per timed run.
const STEPS: usize = 16;
/// Each measurement repeats runs until it has this much step time.
const MIN_MEASURED: Duration = Duration::from_millis(300);

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(9)
        .max(1);
    let counts: Vec<usize> = std::env::var("SWITCHYARD_LORA_COUNTS")
        .unwrap_or_else(|_| "1,4,16".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect();
    let labels: Vec<String> = ["base".to_string(), "16 parts, no adapter".to_string()]
        .into_iter()
        .chain(counts.iter().map(|n| format!("{n} adapters")))
        .collect();
    let times = on_bench_device(threads(), Rounds { rounds, counts });
    report(&labels, &times);
}

struct Rounds {
    rounds: usize,
    counts: Vec<usize>,
}

impl OnDevice for Rounds {
    /// `times[round][configuration]`: seconds per step.
    type Output = Vec<Vec<f64>>;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output {
        rounds_on(&*backend, self.rounds, &self.counts)
    }
}

/// One configuration: each part's adapter (if any) and its number of
/// sequences.
type Config<'a, B> = Vec<(Option<&'a ResidentAdapter<B>>, usize)>;

fn adapter_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_LORA_DIR").map_or_else(|| "/tmp/lora-work".into(), Into::into)
}

fn rounds_on<B: Backend>(backend: &B, rounds: usize, counts: &[usize]) -> Vec<Vec<f64>> {
    let model = load_model(backend);
    let checkpoint = load_checkpoint(&model_path()).expect("the test model");
    let most = counts.iter().copied().max().unwrap_or(1);
    let adapters: Vec<ResidentAdapter<B>> = (0..most)
        .map(|i| {
            let path = adapter_dir().join(format!("a{i}"));
            let weights = load_adapter(&path, &checkpoint).unwrap_or_else(|e| {
                panic!("{e} (write them with benches/lora_serving.py --work DIR --prepare)")
            });
            ResidentAdapter::upload(backend, &weights).expect("upload")
        })
        .collect();
    drop(checkpoint);
    let mut scratch = model.new_scratch(backend);
    // Each configuration: which adapter (if any) each part takes, and each
    // part's number of sequences.
    let mut configs: Vec<Config<'_, B>> = vec![
        vec![(None, SEQUENCES)],
        (0..SEQUENCES).map(|_| (None, 1)).collect(),
    ];
    for &n in counts {
        configs.push(
            (0..n.min(SEQUENCES))
                .map(|a| {
                    let mine = (0..SEQUENCES).filter(|s| s % n == a).count();
                    (adapters.get(a), mine)
                })
                .collect(),
        );
    }
    // Warm-up: every configuration once.
    for config in &configs {
        steps(backend, &model, &mut scratch, config);
    }
    // One configuration alone (its index in the table), for a profile.
    let only: Option<usize> = std::env::var("SWITCHYARD_LORA_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        if let Some(only) = only {
            order = vec![only; configs.len()];
        }
        let mut row = vec![0.0; configs.len()];
        for c in order {
            let (mut spent, mut steps_run) = (Duration::ZERO, 0);
            while spent < MIN_MEASURED {
                spent += steps(backend, &model, &mut scratch, &configs[c]);
                steps_run += STEPS;
            }
            row[c] = spent.as_secs_f64() / steps_run as f64;
        }
        eprintln!(
            "round {round}: {}",
            row.iter()
                .map(|t| format!("{:.2} ms", t * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
        times.push(row);
    }
    times
}

/// Prefills every sequence (untimed), then times [`STEPS`] decode steps
/// over the parts of `config`.
fn steps<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    scratch: &mut Scratch<B>,
    config: &[(Option<&ResidentAdapter<B>>, usize)],
) -> Duration {
    let kv = KvPool::unlimited(KvType::F16);
    let blocks = KvBlocks::new(backend, &kv).expect("a KV store");
    let (mut caches, _) = prefilled(backend, model, scratch, &blocks, SEQUENCES, PROMPT + STEPS);
    // Fixed tokens: what is timed is the step, not what it predicts.
    let tokens: Vec<[u32; 1]> = (0..SEQUENCES as u32).map(|s| [200 + s]).collect();
    let start = Instant::now();
    for step in 0..STEPS {
        let at = PROMPT + step;
        let mut chunks: Vec<SequenceChunk<'_>> = caches
            .iter_mut()
            .zip(&tokens)
            .map(|(cache, token)| SequenceChunk {
                tokens: token,
                start_pos: at,
                table: cache.prepare(backend, at..at + 1).expect("blocks"),
                logits: LogitRows::Last,
                prompt: false,
            })
            .collect();
        let mut rest: &mut [SequenceChunk<'_>] = &mut chunks;
        let mut parts = Vec::with_capacity(config.len());
        for &(adapter, count) in config {
            let (mine, later) = std::mem::take(&mut rest).split_at_mut(count);
            rest = later;
            parts.push(ModelPart {
                model,
                chunks: mine,
                adapter,
            });
        }
        forward_step(backend, &mut blocks.lock(), &mut parts, scratch).expect("decode");
    }
    start.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(labels: &[String], times: &[Vec<f64>]) {
    println!(
        "{SEQUENCES} sequences decoding, {} rounds, --threads {}",
        times.len(),
        threads()
    );
    println!();
    println!("| configuration | ms/step (median) | base / this (median of rounds) | range |");
    println!("|---|---:|---:|---:|");
    for (c, label) in labels.iter().enumerate() {
        let ms = median(times.iter().map(|r| r[c] * 1e3).collect());
        let ratios: Vec<f64> = times.iter().map(|r| r[0] / r[c]).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "| {label} | {ms:.2} | {:.2} | {lo:.2}-{hi:.2} |",
            median(ratios.clone())
        );
    }
}
