//! A draft checkpoint's tokens change speed, never output: the executor
//! with `Speculation::Draft` gives the greedy ids of plain decoding, for a
//! draft that agrees with the target on most tokens (the same synthetic
//! model at a coarser quantization) and one that rarely does (other
//! weights, so most drafts are refused and its cache rolls back every
//! step), one sequence alone and two at once; the drafted tokens are
//! counted. A draft of another tokenizer is refused at load, naming it.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;

#[path = "support/requests.rs"]
mod requests;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::KvConfig;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::serving::{
    CheckpointError, CheckpointHandle, CheckpointId, CheckpointOptions, Executor, ExecutorConfig,
    ExecutorObserver, ServedCheckpoint,
};
use switchyard_engine::speculate::{DraftModel, Speculation};
use switchyard_engine::store::WeightStore;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::{on_each_device, Backend, DType, KvFormat, KvType};

/// Counts the drafted and accepted tokens the executor reports.
#[derive(Default)]
struct Counts {
    drafted: AtomicUsize,
    accepted: AtomicUsize,
}

impl ExecutorObserver for Counts {
    fn speculation(&self, _: &CheckpointId, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted, Ordering::Relaxed);
        self.accepted.fetch_add(accepted, Ordering::Relaxed);
    }
}

fn synthetic(dir: &Path, name: &str, dtype: DType, seed: u64) -> std::path::PathBuf {
    let path = dir.join(name);
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype,
        seed,
    };
    write_gguf(&spec, &path).unwrap();
    path
}

/// The checkpoint at `path` as `test@1`, drafted for by the one at `draft`.
fn served<B: Backend>(backend: &B, path: &Path, draft: Option<&Path>) -> CheckpointHandle<B> {
    let checkpoint = load_checkpoint(path).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let vocab = model.config().vocab_size;
    let mut served = ServedCheckpoint::from_parts(
        CheckpointId::new("test", "1"),
        model,
        tokenizer.clone(),
        switchyard_engine::chat::ChatTemplate::new_or_default(None).unwrap(),
        path,
        checkpoint.format,
    );
    if let Some(draft) = draft {
        let checkpoint = load_checkpoint(draft).unwrap();
        let draft_tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
        let model = LlamaModel::load(backend, &checkpoint).unwrap();
        let paired = DraftModel::pair(model, draft, &draft_tokenizer, &tokenizer, vocab).unwrap();
        served = served.with_draft(paired);
    }
    Arc::new(served)
}

/// Greedy ids of `prompts`, run `together` at a time, under `speculation`.
fn outputs<B: Backend>(
    backend: &Arc<B>,
    checkpoint: &CheckpointHandle<B>,
    speculation: Speculation,
    prompts: &[Vec<u32>],
    together: usize,
    counts: &Arc<Counts>,
) -> Vec<Vec<u32>> {
    let config = ExecutorConfig {
        speculation,
        kv: KvConfig {
            block_positions: 32,
            ..KvConfig::default()
        },
        ..ExecutorConfig::default()
    };
    let exec = Executor::spawn(backend.clone(), config, counts.clone()).unwrap();
    let mut out = Vec::new();
    for group in prompts.chunks(together) {
        let receivers: Vec<_> = group
            .iter()
            .map(|prompt| {
                let (request, receiver) = requests::on_channel(prompt.clone(), 40);
                exec.submit(checkpoint, request).unwrap();
                receiver
            })
            .collect();
        out.extend(receivers.iter().map(requests::ids));
    }
    exec.shutdown();
    out
}

on_each_device!(greedy_output_with_a_draft_model_is_plain_decoding);
fn greedy_output_with_a_draft_model_is_plain_decoding<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let target = synthetic(dir.path(), "target.gguf", DType::Q8_0, 11);
    let close = synthetic(dir.path(), "close.gguf", DType::Q4K, 11);
    let other = synthetic(dir.path(), "other.gguf", DType::Q8_0, 12);
    let tokenizer = Tokenizer::load(&load_checkpoint(&target).unwrap().tokenizer).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:",
        "Once upon a time there was a small",
        "one two three four five six",
    ]
    .iter()
    .map(|text| tokenizer.encode(text, true).unwrap())
    .collect();
    let plain_checkpoint = served(&*backend, &target, None);
    let none = Arc::new(Counts::default());
    let plain = outputs(
        &backend,
        &plain_checkpoint,
        Speculation::Off,
        &prompts,
        1,
        &none,
    );
    assert!(plain.iter().all(|ids| ids.len() == 40));
    for (name, draft) in [("close", &close), ("other", &other)] {
        let checkpoint = served(&*backend, &target, Some(draft));
        for together in [1, 2] {
            let counts = Arc::new(Counts::default());
            let speculation = Speculation::Draft { max_draft: 6 };
            let drafted = outputs(
                &backend,
                &checkpoint,
                speculation,
                &prompts,
                together,
                &counts,
            );
            assert_eq!(drafted, plain, "{name} draft, {together} at once");
            let drafted_tokens = counts.drafted.load(Ordering::Relaxed);
            let accepted = counts.accepted.load(Ordering::Relaxed);
            assert!(drafted_tokens > 0, "{name}: nothing was drafted");
            if name == "close" {
                // The same weights at 4 bits agree with 8 bits on most tokens.
                assert!(
                    accepted * 2 > drafted_tokens,
                    "{name}: {accepted} of {drafted_tokens} kept"
                );
            }
        }
    }
}

on_each_device!(a_draft_of_another_tokenizer_is_refused_at_load_naming_it);
fn a_draft_of_another_tokenizer_is_refused_at_load_naming_it<B: Backend>(backend: Arc<B>) {
    let store = WeightStore::new();
    let options = CheckpointOptions {
        draft: Some(real_models::gemma3()),
        ..CheckpointOptions::default()
    };
    let loaded = ServedCheckpoint::load(
        &*backend,
        &store,
        CheckpointId::new("smollm2", "1"),
        &real_models::smollm2(),
        &options,
        KvFormat::of(KvType::default()),
    );
    let Err(error) = loaded else {
        panic!("a Gemma 3 draft for SmolLM2 was accepted");
    };
    assert!(matches!(error, CheckpointError::Draft { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("gemma-3-270m"), "{message}");
    assert!(message.contains("same tokenizer"), "{message}");
}
