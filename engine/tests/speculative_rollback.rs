//! Rejected speculative drafts leave no trace: a sequence that runs a
//! junk draft after every token and rolls it back (`Session::truncate`,
//! as a verify step that keeps nothing) gives the logits of plain
//! decoding, also in sliding-window layers whose rings the drafts write
//! into. A synthetic Gemma 3 (a local layer of window 16, a global one)
//! with 32-position KV blocks keeps a ring of 160 positions, which the
//! context (256 positions) less room for a draft turns.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::sync::Arc;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvConfig, KvPool};
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::session::Session;
use switchyard_engine::speculate::MAX_DRAFT;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType, KvType};

/// Largest difference allowed between a row run alone and the same row run
/// among a draft's rows: the kernels compute each row the same way, so it
/// is exact in practice; a little slack keeps the test about the rollback.
const TOLERANCE: f32 = 1e-4;

fn rollback_leaves_plain_logits<B: Backend>(backend: &B, preset: Preset, dtype: KvType) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let spec = SyntheticSpec {
        preset,
        dtype: DType::Q8_0,
        seed: 5,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let vocab = model.config().vocab_size as u32;
    let kv = KvPool::new(KvConfig {
        dtype,
        block_positions: 32,
        budget_bytes: usize::MAX,
    });
    let context = model.config().context_length;
    let count = (context - MAX_DRAFT - 1) as u32;
    assert!(count > 160, "the ring must turn");
    let tokens: Vec<u32> = (0..count).map(|i| 3 + (i * 7919) % (vocab - 3)).collect();
    let prompt = 20;
    let capacity = context;
    let mut plain = Session::with_kv(backend, &model, &kv, capacity).unwrap();
    let mut drafted = Session::with_kv(backend, &model, &kv, capacity).unwrap();
    plain.feed(&tokens[..prompt], LogitRows::None).unwrap();
    drafted.feed(&tokens[..prompt], LogitRows::None).unwrap();
    for (step, &token) in tokens.iter().enumerate().skip(prompt) {
        let want = plain.decode(&[token], LogitRows::Last).unwrap();
        // Junk drafts of 1 to MAX_DRAFT tokens, none of them kept.
        let length = 1 + (step * 13) % MAX_DRAFT;
        let junk = (0..length as u32).map(|j| 3 + (token + 101 * (j + 1)) % (vocab - 3));
        let rows: Vec<u32> = std::iter::once(token).chain(junk).collect();
        let got = drafted.decode(&rows, LogitRows::All).unwrap();
        let first = &got[..want.len()];
        let worst = want
            .iter()
            .zip(first)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= TOLERANCE,
            "{preset:?} {dtype:?}: step {step} differs by {worst} after rolled-back drafts"
        );
        drafted.truncate(step + 1).unwrap();
        assert_eq!(drafted.len(), plain.len());
    }
}

fn rolled_back_drafts_leave_plain_logits_in_windowed_layers<B: Backend>(backend: Arc<B>) {
    rollback_leaves_plain_logits(&*backend, Preset::Gemma3, KvType::F16);
}

on_each_device!(rolled_back_drafts_leave_plain_logits_in_windowed_layers);

fn rolled_back_drafts_leave_plain_logits_in_windowed_q8_0_layers<B: Backend>(backend: Arc<B>) {
    rollback_leaves_plain_logits(&*backend, Preset::Gemma3, KvType::Q8_0);
}

on_each_device!(
    rolled_back_drafts_leave_plain_logits_in_windowed_q8_0_layers,
    cpu_only = "Q8_0 KV"
);

fn rolled_back_drafts_leave_plain_logits_in_full_layers<B: Backend>(backend: Arc<B>) {
    rollback_leaves_plain_logits(&*backend, Preset::Smollm2, KvType::F32);
}

on_each_device!(
    rolled_back_drafts_leave_plain_logits_in_full_layers,
    cpu_only = "F32 KV"
);
