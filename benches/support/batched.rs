//! What the batched-decode benches share: the test model, the thread
//! count, and one timed run of decode steps over a batch of sequences.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvBlocks, KvPool, SequenceKv};
use switchyard_engine::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};
use switchyard_engine::sampling::argmax;
use switchyard_kernels::Backend;
use switchyard_kernels::KvPrefix;
use switchyard_kernels::KvType;

/// Prompt tokens each sequence prefills (untimed) before decoding.
pub const PROMPT_TOKENS: usize = 8;
/// Decode steps per timed run: each sequence decodes this many tokens.
pub const STEPS: usize = 16;
/// The batch sizes the issue asks for.
pub const BATCHES: [usize; 4] = [1, 4, 16, 64];

/// `SWITCHYARD_MODEL`, or where `scripts/fetch-model.sh` caches the model.
pub fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_MODEL") {
        return path.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// `SWITCHYARD_BENCH_THREADS` (default 2).
pub fn threads() -> usize {
    std::env::var("SWITCHYARD_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// The test model on `backend`; prints the load time.
pub fn load_model<B: Backend>(backend: &B) -> LlamaModel<B> {
    let checkpoint = match load_checkpoint(&model_path()) {
        Ok(checkpoint) => checkpoint,
        Err(e) => panic!("run scripts/fetch-model.sh first: {e}"),
    };
    let started = Instant::now();
    let model = LlamaModel::load(backend, &checkpoint).expect("the test model loads");
    eprintln!(
        "model load (repacking included) on {}: {:.1} ms",
        backend.name(),
        started.elapsed().as_secs_f64() * 1e3
    );
    model
}

/// Prefills `batch` sequences of their own 8-token prompts (untimed),
/// then times [`STEPS`] batched steps of one token per sequence.
pub fn decode_steps<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    scratch: &mut Scratch<B>,
    batch: usize,
) -> Duration {
    let kv = KvPool::unlimited(KvType::F16);
    let blocks = KvBlocks::new(backend, &kv).expect("a KV store");
    let (mut caches, mut next) = prefilled(
        backend,
        model,
        scratch,
        &blocks,
        batch,
        PROMPT_TOKENS + STEPS,
    );
    let vocab = model.config().vocab_size;
    let start = Instant::now();
    for step in 0..STEPS {
        let mut chunks: Vec<SequenceChunk<'_>> = caches
            .iter_mut()
            .zip(&next)
            .map(|(cache, token)| {
                let at = PROMPT_TOKENS + step;
                SequenceChunk {
                    tokens: token,
                    start_pos: at,
                    table: cache.prepare(backend, at..at + 1).expect("blocks"),
                    logits: LogitRows::Last,
                    prompt: false,
                }
            })
            .collect();
        let logits = model
            .forward(backend, &mut blocks.lock(), &mut chunks, scratch)
            .expect("decode");
        drop(chunks);
        for (token, row) in next.iter_mut().zip(logits.chunks_exact(vocab)) {
            *token = [argmax(row)];
        }
    }
    start.elapsed()
}

/// `count` sequences in `blocks`, each with room for `capacity` tokens and
/// prefilled (untimed) with its own [`PROMPT_TOKENS`]-token prompt, and each
/// one's greedy next token.
pub fn prefilled<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    scratch: &mut Scratch<B>,
    blocks: &Arc<KvBlocks<B>>,
    count: usize,
    capacity: usize,
) -> (Vec<SequenceKv<B>>, Vec<[u32; 1]>) {
    let mut caches: Vec<_> = (0..count)
        .map(|_| {
            SequenceKv::for_model(backend, blocks, model, capacity, KvPrefix::none())
                .expect("cache")
        })
        .collect();
    let mut next = Vec::with_capacity(count);
    for (s, cache) in caches.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..PROMPT_TOKENS as u32)
            .map(|i| 100 + (i * 7919 + s as u32 * 131) % 48000)
            .collect();
        let mut chunk = [SequenceChunk {
            tokens: &prompt,
            start_pos: 0,
            table: cache.prepare(backend, 0..PROMPT_TOKENS).expect("blocks"),
            logits: LogitRows::Last,
            prompt: true,
        }];
        let logits = model
            .forward(backend, &mut blocks.lock(), &mut chunk, scratch)
            .expect("prefill");
        next.push([argmax(logits)]);
    }
    (caches, next)
}
