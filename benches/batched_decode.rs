//! Batched decode: aggregate tokens/s when `B` sequences each decode one
//! token per forward step (B = 1, 4, 16, 64), through the engine's batched
//! forward (`LlamaModel::forward` with one chunk per sequence), on the real
//! test model (SmolLM2-135M Q4_1). Each sequence starts from its own
//! 8-token prompt; a measured iteration is `STEPS` steps.
//!
//! `cargo bench --bench batched_decode -- --noplot`; threads come from
//! `SWITCHYARD_BENCH_THREADS` (default 2).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::{LlamaModel, LogitRows, SequenceChunk};
use switchyard_engine::sampling::argmax;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_kernels::Backend;

const PROMPT_TOKENS: usize = 8;
const STEPS: usize = 16;
const BATCHES: [usize; 4] = [1, 4, 16, 64];

fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_MODEL") {
        return path.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn threads() -> usize {
    std::env::var("SWITCHYARD_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

fn bench_batched(c: &mut Criterion) {
    let checkpoint = match load_checkpoint(&model_path()) {
        Ok(checkpoint) => checkpoint,
        Err(e) => panic!("run scripts/fetch-model.sh first: {e}"),
    };
    let threads = threads();
    let backend = CpuBackend::new(threads);
    let started = Instant::now();
    let model = LlamaModel::load(&backend, &checkpoint).expect("the test model loads");
    eprintln!(
        "model load (repacking included) on {}: {:.1} ms",
        backend.name(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let mut group = c.benchmark_group("smollm2-q4_1/batched-decode");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    for batch in BATCHES {
        group.throughput(Throughput::Elements((batch * STEPS) as u64));
        group.bench_function(format!("b{batch}-t{threads}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += decode_steps(&backend, &model, batch);
                }
                total
            })
        });
    }
    group.finish();
}

/// Prefills `batch` sequences (untimed), then times `STEPS` batched steps.
fn decode_steps(backend: &CpuBackend, model: &LlamaModel<CpuBackend>, batch: usize) -> Duration {
    let capacity = PROMPT_TOKENS + STEPS;
    let mut caches: Vec<_> = (0..batch)
        .map(|_| model.new_cache(backend, capacity).expect("cache"))
        .collect();
    let mut scratch = model.new_scratch(backend);
    let vocab = model.config().vocab_size;
    let mut next = Vec::with_capacity(batch);
    for (s, cache) in caches.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..PROMPT_TOKENS as u32)
            .map(|i| 100 + (i * 7919 + s as u32 * 131) % 48000)
            .collect();
        let mut chunk = [SequenceChunk {
            tokens: &prompt,
            start_pos: 0,
            cache,
            logits: LogitRows::Last,
        }];
        let logits = model
            .forward(backend, &mut chunk, &mut scratch)
            .expect("prefill");
        next.push([argmax(logits)]);
    }
    let start = Instant::now();
    for step in 0..STEPS {
        let mut chunks: Vec<SequenceChunk<'_, CpuBackend>> = caches
            .iter_mut()
            .zip(&next)
            .map(|(cache, token)| SequenceChunk {
                tokens: token,
                start_pos: PROMPT_TOKENS + step,
                cache,
                logits: LogitRows::Last,
            })
            .collect();
        let logits = model
            .forward(backend, &mut chunks, &mut scratch)
            .expect("decode");
        drop(chunks);
        for (token, row) in next.iter_mut().zip(logits.chunks_exact(vocab)) {
            *token = [argmax(row)];
        }
    }
    start.elapsed()
}

criterion_group!(benches, bench_batched);
criterion_main!(benches);
