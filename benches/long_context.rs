//! Prompt and decode tokens/s of one sequence at a given context depth:
//! `LC_DEPTHS` tokens already in the KV cache (default 0,1024,4096,8000),
//! then `LC_PROMPT` more prompt tokens timed as one feed (prompt tok/s at
//! that depth), then `LC_DECODE` tokens timed one step each (decode
//! tok/s). Prints one JSON line per depth. `benches/long_context.py` runs
//! it next to llama.cpp doing the same and draws `docs/long_context.svg`.
//!
//! Model: `SWITCHYARD_MODEL` (default: the cached SmolLM2 Q4_1); threads
//! `LC_THREADS` (2); KV type `LC_KV` (f16); best of `LC_REPEATS` (2);
//! attention's products `SWITCHYARD_BENCH_ATTENTION` (f32).

#[path = "support/device.rs"]
mod device;

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use device::on_bench_device;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::formats::Checkpoint;
use switchyard_engine::kv::{KvConfig, KvPool};
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::sampling::argmax;
use switchyard_engine::session::Session;
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::{Backend, KvType};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The ids `benches/llama_cpp_peer.py` and `long_context.py` feed llama.cpp.
fn ids(from: usize, len: usize) -> Vec<u32> {
    (from as u32..(from + len) as u32)
        .map(|i| 100 + (i * 7919) % 48000)
        .collect()
}

fn main() {
    let path = std::env::var_os("SWITCHYARD_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    let depths: Vec<usize> = std::env::var("LC_DEPTHS")
        .unwrap_or_else(|_| "0,1024,4096,8000".into())
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    let threads = env_or("LC_THREADS", 2usize);
    let kv: KvType = env_or("LC_KV", KvType::F16);
    let prompt = env_or("LC_PROMPT", 128usize);
    let decode = env_or("LC_DECODE", 32usize);
    let repeats = env_or("LC_REPEATS", 2usize).max(1);
    let checkpoint = load_checkpoint(&path).expect("run scripts/fetch-model.sh first");
    let run = Depths {
        checkpoint,
        depths,
        threads,
        kv,
        prompt,
        decode,
        repeats,
    };
    on_bench_device(threads, run);
}

/// The measurements of `main`, on whichever backend
/// `SWITCHYARD_BENCH_DEVICE` names.
struct Depths {
    checkpoint: Checkpoint,
    depths: Vec<usize>,
    threads: usize,
    kv: KvType,
    prompt: usize,
    decode: usize,
    repeats: usize,
}

impl OnDevice for Depths {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) {
        depths_on(&*backend, &self);
    }
}

fn depths_on<B: Backend>(backend: &B, run: &Depths) {
    let Depths {
        checkpoint,
        depths,
        threads,
        kv,
        prompt,
        decode,
        repeats,
    } = run;
    let (threads, kv, prompt, decode, repeats) = (*threads, *kv, *prompt, *decode, *repeats);
    let pool = KvPool::new(KvConfig {
        dtype: kv,
        ..KvConfig::default()
    });
    let model = LlamaModel::load(backend, checkpoint).expect("the model loads");
    let windows = model.config().layer_windows();
    for &depth in depths {
        let (mut best_prompt, mut best_decode) = (0.0f64, 0.0f64);
        let (mut kv_bytes, mut kv_windowed) = (0, 0);
        for _ in 0..repeats {
            let mut session =
                Session::with_kv(backend, &model, &pool, depth + prompt + decode).expect("session");
            if depth > 0 {
                session
                    .feed(&ids(0, depth), LogitRows::None)
                    .expect("context");
            }
            let start = Instant::now();
            let logits = session
                .feed(&ids(depth, prompt), LogitRows::Last)
                .expect("prompt");
            best_prompt = best_prompt.max(prompt as f64 / start.elapsed().as_secs_f64());
            let start = Instant::now();
            // The fixed ids llama.cpp gets (not the greedy ones), so both
            // engines see exactly the same tokens; the greedy pick stays, as
            // the sampling a real step does, taken where the step left its
            // logits (the server's sampler reads them in place too).
            black_box(argmax(&logits));
            for next in ids(depth + prompt, decode) {
                let token = session.decode_greedy(&[next]).expect("decode");
                black_box(token);
            }
            best_decode = best_decode.max(decode as f64 / start.elapsed().as_secs_f64());
            let cache = session.cache();
            kv_bytes = cache.allocated_bytes();
            // The windowed layers' part: flat from the window on (a ring).
            kv_windowed = (0..cache.layout().layers())
                .filter(|l| windows.get(*l).copied().flatten().is_some())
                .map(|l| cache.layer_allocated_bytes(l))
                .sum();
        }
        println!(
            "{{\"engine\": \"switchyard\", \"kv\": \"{kv}\", \"attention\": \"{}\", \
             \"threads\": {threads}, \
             \"depth\": {depth}, \"prompt\": {prompt}, \"decode\": {decode}, \
             \"prompt_tok_s\": {best_prompt:.2}, \"decode_tok_s\": {best_decode:.2}, \
             \"kv_bytes\": {kv_bytes}, \"kv_windowed_bytes\": {kv_windowed}}}",
            device::attention()
        );
    }
}
