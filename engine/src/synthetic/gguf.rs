//! Writing a synthetic model as a GGUF v3 file, the way llama.cpp's
//! converter would: Llama-architecture Q and K rows permuted for
//! interleaved rope, Llama 3 scaling as a `rope_freqs.weight` tensor.

use std::path::Path;

use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::DType;

use super::bpe::{SyntheticVocab, CHATML_TEMPLATE};
use super::weights::{permute_for_interleaved_rope, synthetic_tensors};
use super::{bos_token_id, eos_token_id, SyntheticSpec};
use crate::formats::gguf::{llama3_rope_divisors, GgufWriter, MetaValue};
use crate::formats::{CheckpointFormat, FormatError};
use crate::model::config::{ModelConfig, RopeScaling};
use switchyard_kernels::RopeStyle;

/// Writes `spec` as a GGUF file at `path`: weight matrices in `spec.dtype`,
/// norm weights and biases in f32.
pub fn write_gguf(spec: &SyntheticSpec, path: &Path) -> Result<(), FormatError> {
    let config = spec.preset.config(CheckpointFormat::Gguf);
    let mut w = GgufWriter::new(path);
    write_model_metadata(&mut w, spec, &config);
    write_tokenizer_metadata(&mut w, &SyntheticVocab::build(config.vocab_size));

    for t in synthetic_tensors(&config, spec.seed) {
        let values = if config.rope_style == RopeStyle::Interleaved {
            interleave_qk(&t.name, t.values, &config)
        } else {
            t.values
        };
        let dtype = if t.shape.len() == 1 {
            DType::F32
        } else {
            spec.dtype
        };
        let bytes = quantize(dtype, &values).map_err(|e| FormatError::Unwritable {
            path: path.to_path_buf(),
            reason: format!("tensor '{}': {e}", t.name),
        })?;
        w.add_tensor(t.name, dtype, &t.shape, bytes.into())?;
    }
    if let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_context_length,
    } = config.rope_scaling
    {
        let divisors = llama3_rope_divisors(
            config.rope_theta,
            config.head_dim,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        );
        let bytes = quantize(DType::F32, &divisors).unwrap_or_default();
        w.add_tensor(
            "rope_freqs.weight",
            DType::F32,
            &[divisors.len()],
            bytes.into(),
        )?;
    }
    w.write()
}

/// Q and K (weights and biases) reordered as llama.cpp's converter does.
fn interleave_qk(name: &str, values: Vec<f32>, config: &ModelConfig) -> Vec<f32> {
    let heads = if name.contains(".attn_q.") {
        config.n_heads
    } else if name.contains(".attn_k.") {
        config.n_kv_heads
    } else {
        return values;
    };
    let row_len = if name.ends_with(".bias") {
        1
    } else {
        config.hidden_size
    };
    permute_for_interleaved_rope(&values, heads, row_len)
}

fn write_model_metadata(w: &mut GgufWriter, spec: &SyntheticSpec, config: &ModelConfig) {
    let arch = config.architecture.name();
    let u32_of = |v: usize| MetaValue::U32(u32::try_from(v).unwrap_or(u32::MAX));
    w.add_metadata("general.architecture", MetaValue::String(arch.into()));
    w.add_metadata(
        "general.name",
        MetaValue::String(format!(
            "synthetic-{}-{}-seed{}",
            spec.preset, spec.dtype, spec.seed
        )),
    );
    let entries = [
        ("context_length", u32_of(config.context_length)),
        ("embedding_length", u32_of(config.hidden_size)),
        ("block_count", u32_of(config.n_layers)),
        ("feed_forward_length", u32_of(config.intermediate_size)),
        ("attention.head_count", u32_of(config.n_heads)),
        ("attention.head_count_kv", u32_of(config.n_kv_heads)),
        ("attention.key_length", u32_of(config.head_dim)),
        ("attention.value_length", u32_of(config.head_dim)),
        ("rope.dimension_count", u32_of(config.head_dim)),
        ("vocab_size", u32_of(config.vocab_size)),
        (
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(config.rms_norm_eps),
        ),
        ("rope.freq_base", MetaValue::F32(config.rope_theta)),
    ];
    for (key, value) in entries {
        w.add_metadata(format!("{arch}.{key}"), value);
    }
    let t = &config.traits;
    if let Some(window) = t.sliding_window {
        w.add_metadata(format!("{arch}.attention.sliding_window"), u32_of(window));
    }
    if config.architecture.is_gemma() {
        w.add_metadata(
            format!("{arch}.attention.sliding_window_pattern"),
            u32_of(t.swa_pattern),
        );
    }
    if let Some(cap) = t.attn_softcap {
        w.add_metadata(
            format!("{arch}.attention.logit_softcapping"),
            MetaValue::F32(cap),
        );
    }
    if let Some(cap) = t.final_softcap {
        w.add_metadata(
            format!("{arch}.final_logit_softcapping"),
            MetaValue::F32(cap),
        );
    }
    if let Some(theta) = t.rope_local_theta {
        w.add_metadata(format!("{arch}.rope.freq_base_swa"), MetaValue::F32(theta));
    }
    if let RopeScaling::Llama3 {
        original_context_length,
        ..
    } = config.rope_scaling
    {
        // Not read by llama.cpp for Llama 3 scaling; lets our reader recover
        // the original parameters rather than equivalent ones.
        w.add_metadata(
            format!("{arch}.rope.scaling.original_context_length"),
            u32_of(original_context_length),
        );
    }
}

fn write_tokenizer_metadata(w: &mut GgufWriter, vocab: &SyntheticVocab) {
    let strings =
        |items: Vec<String>| MetaValue::Array(items.into_iter().map(MetaValue::String).collect());
    let special_from = vocab
        .tokens
        .len()
        .saturating_sub(super::SPECIAL_TOKENS.len());
    w.add_metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()));
    w.add_metadata("tokenizer.ggml.tokens", strings(vocab.tokens.clone()));
    w.add_metadata(
        "tokenizer.ggml.token_type",
        MetaValue::Array(
            (0..vocab.tokens.len())
                // 1: normal, 3: control (llama.cpp's token types).
                .map(|i| MetaValue::I32(if i >= special_from { 3 } else { 1 }))
                .collect(),
        ),
    );
    w.add_metadata(
        "tokenizer.ggml.merges",
        strings(
            vocab
                .merges
                .iter()
                .map(|(a, b)| format!("{a} {b}"))
                .collect(),
        ),
    );
    w.add_metadata(
        "tokenizer.ggml.bos_token_id",
        MetaValue::U32(bos_token_id(vocab)),
    );
    w.add_metadata(
        "tokenizer.ggml.eos_token_id",
        MetaValue::U32(eos_token_id(vocab)),
    );
    w.add_metadata(
        "tokenizer.ggml.padding_token_id",
        MetaValue::U32(bos_token_id(vocab)),
    );
    w.add_metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    w.add_metadata(
        "tokenizer.chat_template",
        MetaValue::String(CHATML_TEMPLATE.into()),
    );
}
