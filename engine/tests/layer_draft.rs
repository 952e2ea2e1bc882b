//! A draft made of some of the real SmolLM2's layers
//! (`formats::gguf::write_layer_subset`, `switchyard layer-draft`): it has
//! the layers asked for, renumbered, with their bytes unchanged and the
//! model's own embedding, norm and tokenizer; all layers kept decode as the
//! model, token for token; one left out pairs with the model as its draft
//! and still names many of the model's greedy tokens; a Gemma 3,
//! whose layers differ by position, and a layer past the model are
//! refused, naming why.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;

use switchyard_engine::formats::gguf::{write_layer_subset, GgufFile};
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::sampling::argmax;
use switchyard_engine::session::Session;
use switchyard_engine::speculate::DraftModel;
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::cpu::CpuBackend;

const KEEP: [usize; 8] = [0, 1, 2, 3, 4, 5, 28, 29];

#[test]
fn a_layer_subset_keeps_those_layers_bytes_and_the_rest_of_the_model() {
    let base_path = real_models::smollm2();
    let base = GgufFile::open(&base_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft.gguf");
    write_layer_subset(&base, &KEEP, &out).unwrap();
    let draft = GgufFile::open(&out).unwrap();
    assert_eq!(
        draft.metadata().get_u64("llama.block_count"),
        Some(KEEP.len() as u64)
    );
    for (new, &old) in KEEP.iter().enumerate() {
        let a = draft
            .tensor_data(&format!("blk.{new}.attn_q.weight"))
            .unwrap();
        let b = base
            .tensor_data(&format!("blk.{old}.attn_q.weight"))
            .unwrap();
        assert_eq!(a.data, b.data, "layer {old} kept as {new}");
    }
    assert!(!draft
        .tensors()
        .contains_key(&format!("blk.{}.attn_q.weight", KEEP.len())));
    for name in ["token_embd.weight", "output_norm.weight"] {
        assert_eq!(
            draft.tensor_data(name).unwrap().data,
            base.tensor_data(name).unwrap().data
        );
    }
    assert_eq!(
        draft.metadata().get("tokenizer.ggml.tokens"),
        base.metadata().get("tokenizer.ggml.tokens")
    );
    assert!(!dir.path().join("draft.gguf.partial").exists());
}

#[test]
fn all_layers_decode_as_the_model_and_one_left_out_still_agrees_often() {
    let base_path = real_models::smollm2();
    let base = GgufFile::open(&base_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backend = CpuBackend::new(2);
    let (target, target_tok) = load(&backend, &base_path);
    let vocab = target.config().vocab_size;
    let prompt = target_tok
        .encode(
            "The capital of France is Paris. The capital of Spain is",
            false,
        )
        .unwrap();
    let target_ids = greedy(&backend, &target, &prompt, 24);

    // Every layer, renumbered onto itself: the model, token for token.
    let whole = dir.path().join("whole.gguf");
    write_layer_subset(&base, &(0..30).collect::<Vec<_>>(), &whole).unwrap();
    let (model, _) = load(&backend, &whole);
    assert_eq!(greedy(&backend, &model, &prompt, 24), target_ids);

    // Layer 14 left out: it pairs as a draft, and names the model's next
    // token on a good share of the model's own continuation.
    let out = dir.path().join("draft.gguf");
    let keep: Vec<usize> = (0..30).filter(|&l| l != 14).collect();
    write_layer_subset(&base, &keep, &out).unwrap();
    let (draft, draft_tok) = load(&backend, &out);
    assert_eq!(draft.config().n_layers, keep.len());
    let paired = DraftModel::pair(draft, &out, &draft_tok, &target_tok, vocab).unwrap();
    let agree = (0..target_ids.len())
        .filter(|&i| {
            let mut context = prompt.clone();
            context.extend_from_slice(&target_ids[..i]);
            greedy(&backend, &paired.model, &context, 1)[0] == target_ids[i]
        })
        .count();
    assert!(
        agree * 4 >= target_ids.len(),
        "the draft agrees on {agree} of {}",
        target_ids.len()
    );
}

#[test]
fn gemma3_and_a_missing_layer_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft.gguf");
    let gemma = GgufFile::open(real_models::gemma3()).unwrap();
    let error = write_layer_subset(&gemma, &[0, 1], &out)
        .unwrap_err()
        .to_string();
    assert!(error.contains("attend globally"), "{error}");
    let smollm = GgufFile::open(real_models::smollm2()).unwrap();
    let error = write_layer_subset(&smollm, &[0, 30], &out)
        .unwrap_err()
        .to_string();
    assert!(error.contains("layer 30 does not exist"), "{error}");
    assert!(!out.exists());
}

fn load(backend: &CpuBackend, path: &std::path::Path) -> (LlamaModel<CpuBackend>, Tokenizer) {
    let checkpoint = load_checkpoint(path).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    (LlamaModel::load(backend, &checkpoint).unwrap(), tokenizer)
}

fn greedy(
    backend: &CpuBackend,
    model: &LlamaModel<CpuBackend>,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut session = Session::new(backend, model, prompt.len() + n).unwrap();
    let mut logits = session.feed(prompt, LogitRows::Last).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        logits = session.feed(&[next], LogitRows::Last).unwrap();
    }
    out
}
