//! Prompt (128 and 512 tokens) and generation (128 tokens) throughput of
//! the real test model (SmolLM2-135M Q4_1) with 1 and 2 threads. `benches/compare_llama_cpp.sh` runs this next
//! to llama.cpp on the same file and prints the ratios.
//!
//! The model path comes from `SWITCHYARD_MODEL` or the cache that
//! `scripts/fetch-model.sh` fills.

#[path = "support/device.rs"]
mod device;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use device::on_bench_device;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::formats::Checkpoint;
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::sampling::argmax;
use switchyard_engine::session::Session;
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::Backend;

const PROMPT_LENGTHS: [usize; 2] = [128, 512];
const GENERATED_TOKENS: usize = 128;

fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_MODEL") {
        return path.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// A fixed, ordinary-looking prompt: the same ids are fed to llama.cpp.
pub fn prompt_ids(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 100 + (i * 7919) % 48000).collect()
}

fn bench_generation(c: &mut Criterion) {
    let path = model_path();
    let checkpoint = match load_checkpoint(&path) {
        Ok(checkpoint) => checkpoint,
        Err(e) => panic!("run scripts/fetch-model.sh first: {e}"),
    };
    let prompt = prompt_ids(*PROMPT_LENGTHS.iter().max().unwrap_or(&0));
    // Names the criterion groups: `benches/compare_llama_cpp.sh gemma3` sets it.
    let label = std::env::var("SWITCHYARD_BENCH_LABEL").unwrap_or_else(|_| "smollm2-q4_1".into());
    for threads in [1usize, 2] {
        let work = OnThreads {
            c: &mut *c,
            checkpoint: &checkpoint,
            prompt: &prompt,
            label: &label,
            threads,
        };
        on_bench_device(threads, work);
    }
}

/// One thread count's groups, on whichever backend
/// `SWITCHYARD_BENCH_DEVICE` names.
struct OnThreads<'a> {
    c: &'a mut Criterion,
    checkpoint: &'a Checkpoint,
    prompt: &'a [u32],
    label: &'a str,
    threads: usize,
}

impl OnDevice for OnThreads<'_> {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) {
        let OnThreads {
            c,
            checkpoint,
            prompt,
            label,
            threads,
        } = self;
        let backend = &*backend;
        let model = LlamaModel::load(backend, checkpoint).expect("the test model loads");

        for len in PROMPT_LENGTHS {
            let mut group = c.benchmark_group(format!("{label}/prompt{len}"));
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(8));
            group.throughput(Throughput::Elements(len as u64));
            group.bench_function(format!("{threads}-threads"), |b| {
                b.iter(|| {
                    let mut session = Session::new(backend, &model, len).expect("session");
                    session
                        .feed(&prompt[..len], LogitRows::Last)
                        .expect("prefill")
                })
            });
            group.finish();
        }

        let mut group = c.benchmark_group(format!("{label}/generate"));
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(10));
        group.throughput(Throughput::Elements(GENERATED_TOKENS as u64));
        group.bench_function(format!("{threads}-threads"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let capacity = 8 + GENERATED_TOKENS;
                    let mut session = Session::new(backend, &model, capacity).expect("session");
                    let mut logits = session
                        .feed(&prompt[..8], LogitRows::Last)
                        .expect("prefill");
                    let start = Instant::now();
                    for _ in 0..GENERATED_TOKENS {
                        let next = argmax(&logits);
                        logits = session.decode(&[next], LogitRows::Last).expect("decode");
                    }
                    total += start.elapsed();
                }
                total
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench_generation);
criterion_main!(benches);
