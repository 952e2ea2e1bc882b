//! `eval::evaluate` scores a choice by the same numbers as running the
//! context and the choice through a plain [`Session`] one token sequence
//! at a time: batching items, sharing a context's KV across its choices
//! (overwriting the previous choice's positions) and splitting items too
//! long for a sliding window (Gemma 3's local layers) change nothing but
//! float rounding in the batch's row order.

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use switchyard_engine::eval::{evaluate, log_prob, EvalOptions, ItemResult, Suite};
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::session::Session;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::{on_each_device, Backend, DType};

/// Log-likelihoods agree to this (nats, summed over a choice's tokens):
/// the same kernels on differently batched rows round alike but not
/// identically (the int8 activation rounding is per row, attention per sequence).
const LOGLIK_ATOL: f64 = 2e-3;

fn suite_text() -> String {
    let long = "the river runs past the old stone house and the green field ".repeat(3);
    let mut lines = vec![
        r#"{"context": "hello", "choices": [" world", " there friend", "!"], "answer": 0}"#
            .to_string(),
        r#"{"context": "one two three ", "choices": ["four", "five six"], "answer": 0}"#
            .to_string(),
        r#"{"context": "", "choices": ["a b", "c"], "answer": 1}"#.to_string(),
        r#"{"prompt": "count: one two", "answer": "three"}"#.to_string(),
    ];
    lines.push(format!(
        r#"{{"context": "{long}", "choices": [" and the sky", " x", " water light stone"], "answer": 2}}"#
    ));
    lines.join("\n")
}

/// Each choice's log-likelihood computed one sequence at a time.
fn session_logliks<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    context: &[u32],
    choices: &[Vec<u32>],
) -> Vec<f64> {
    let vocab = model.config().vocab_size;
    choices
        .iter()
        .map(|choice| {
            let mut session = Session::new(backend, model, context.len() + choice.len()).unwrap();
            let mut tokens = context.to_vec();
            tokens.extend_from_slice(&choice[..choice.len() - 1]);
            let logits = session.feed(&tokens, LogitRows::All).unwrap();
            choice
                .iter()
                .enumerate()
                .map(|(t, &target)| {
                    let row = context.len() - 1 + t;
                    log_prob(&logits[row * vocab..(row + 1) * vocab], target)
                })
                .sum()
        })
        .collect()
}

fn check<B: Backend>(backend: &B, preset: Preset, dir: &Path) {
    let path = dir.join(format!("{preset:?}.gguf"));
    let spec = SyntheticSpec {
        preset,
        dtype: DType::Q8_0,
        seed: 11,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    let suite = Suite::parse(Path::new("t.jsonl"), &suite_text()).unwrap();
    // A small batch budget puts the items in several batches.
    let options = EvalOptions {
        batch_tokens: 24,
        ..EvalOptions::default()
    };
    let report = evaluate(backend, &model, &tokenizer, &suite, &options).unwrap();
    assert_eq!(report.summary.n, 5);
    let mut compared = 0;
    for item in &report.items {
        let ItemResult::Choice {
            logliks,
            context_ids,
            choice_ids,
            ..
        } = item
        else {
            continue;
        };
        let expected = session_logliks(backend, &model, context_ids, choice_ids);
        for (got, want) in logliks.iter().zip(&expected) {
            assert!(
                (got - want).abs() <= LOGLIK_ATOL,
                "{preset:?}: {got} vs {want} ({logliks:?} vs {expected:?})"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 3 + 2 + 2 + 3);
}

fn batched_shared_context_scores_match_one_sequence_at_a_time<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    check(&*backend, Preset::Smollm2, dir.path());
}

on_each_device!(batched_shared_context_scores_match_one_sequence_at_a_time);

fn items_longer_than_a_sliding_window_are_scored_choice_by_choice<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    // Gemma 3's synthetic local layers have a window of 16: the long item
    // exceeds it, so each of its choices runs on its own cache (the safe
    // path, taken whether or not this backend's ring would have wrapped).
    check(&*backend, Preset::Gemma3, dir.path());
}

on_each_device!(items_longer_than_a_sliding_window_are_scored_choice_by_choice);
