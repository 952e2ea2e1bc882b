//! Writing a synthetic model as a Hugging Face folder: `config.json`,
//! safetensors weights (one file, or shards with an index),
//! `tokenizer.json` and `tokenizer_config.json`.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::DType;

use super::bpe::{SyntheticVocab, CHATML_TEMPLATE, SPECIAL_TOKENS};
use super::weights::synthetic_tensors;
use super::{bos_token_id, eos_token_id, SyntheticSpec};
use crate::formats::safetensors::{hf_name, INDEX_FILE, WEIGHTS_FILE};
use crate::formats::{CheckpointFormat, FormatError};
use crate::model::config::{Architecture, ModelConfig, RopeScaling};

/// Writes `spec` as a Hugging Face folder in `dir` (created if missing),
/// every tensor in `spec.dtype` (f32, f16 or bf16). `shards > 1` splits the
/// weights into that many files plus `model.safetensors.index.json`.
pub fn write_safetensors(
    spec: &SyntheticSpec,
    dir: &Path,
    shards: usize,
) -> Result<(), FormatError> {
    let unwritable = |reason: String| FormatError::Unwritable {
        path: dir.to_path_buf(),
        reason,
    };
    let st_dtype = match spec.dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        other => {
            return Err(unwritable(format!(
                "safetensors checkpoints hold f32, f16 or bf16 weights, not {other}; write GGUF \
                 for quantized types"
            )))
        }
    };
    std::fs::create_dir_all(dir).map_err(|source| FormatError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let config = spec.preset.config(CheckpointFormat::Safetensors);
    let vocab = SyntheticVocab::build(config.vocab_size);

    let mut tensors = Vec::new();
    for t in synthetic_tensors(&config, spec.seed) {
        // Hugging Face Gemma stores norm weights as `w` for a scale of `1 + w`.
        let offset = config.traits.norm_offset;
        let values: Vec<f32> = if offset != 0.0 && t.name.ends_with("norm.weight") {
            t.values.iter().map(|v| v - offset).collect()
        } else {
            t.values
        };
        let name = hf_name(&t.name, config.architecture).unwrap_or(t.name);
        let bytes = quantize(spec.dtype, &values).map_err(|e| unwritable(e.to_string()))?;
        tensors.push((name, t.shape, bytes));
    }
    let shards = shards.clamp(1, tensors.len().max(1));
    let per_shard = tensors.len().div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0usize;
    for (i, chunk) in tensors.chunks(per_shard.max(1)).enumerate() {
        let file_name = if shards == 1 {
            WEIGHTS_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, shards)
        };
        let mut views = Vec::with_capacity(chunk.len());
        for (name, shape, bytes) in chunk {
            let view = TensorView::new(st_dtype, shape.clone(), bytes)
                .map_err(|e| unwritable(format!("tensor '{name}': {e}")))?;
            views.push((name.clone(), view));
            weight_map.insert(name.clone(), file_name.clone());
            total_size += bytes.len();
        }
        let metadata = Some(std::collections::HashMap::from([(
            "format".to_string(),
            "pt".to_string(),
        )]));
        safetensors::serialize_to_file(views, metadata, &dir.join(&file_name))
            .map_err(|e| unwritable(format!("{file_name}: {e}")))?;
    }
    if shards > 1 {
        let index = json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map });
        write_json(&dir.join(INDEX_FILE), &index)?;
    }
    write_json(
        &dir.join("config.json"),
        &config_json(&config, &vocab, spec.dtype),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json(&vocab))?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &tokenizer_config_json(&vocab, config.context_length),
    )
}

fn write_json(path: &Path, value: &Value) -> Result<(), FormatError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| FormatError::Unwritable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    std::fs::write(path, text).map_err(|source| FormatError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn config_json(config: &ModelConfig, vocab: &SyntheticVocab, dtype: DType) -> Value {
    let (model_type, class) = match config.architecture {
        Architecture::Llama => ("llama", "LlamaForCausalLM"),
        Architecture::Mistral => ("mistral", "MistralForCausalLM"),
        Architecture::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        Architecture::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Architecture::Gemma2 => ("gemma2", "Gemma2ForCausalLM"),
        Architecture::Gemma3 => ("gemma3_text", "Gemma3ForCausalLM"),
        Architecture::Phi3 => ("phi3", "Phi3ForCausalLM"),
    };
    let t = &config.traits;
    let rope_scaling = match config.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({ "rope_type": "linear", "factor": factor }),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_context_length,
        }),
    };
    let mut value = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tied_embeddings,
        "attention_bias": config.qkv_bias,
        "bos_token_id": bos_token_id(vocab),
        "eos_token_id": eos_token_id(vocab),
        "torch_dtype": match dtype {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            _ => "float32",
        },
    });
    if let Some(map) = value.as_object_mut() {
        if config.architecture.is_gemma() {
            map.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            let scale = t.attn_scale.unwrap_or(1.0);
            map.insert("query_pre_attn_scalar".into(), json!(1.0 / (scale * scale)));
            map.insert("attn_logit_softcapping".into(), json!(t.attn_softcap));
            map.insert("final_logit_softcapping".into(), json!(t.final_softcap));
            map.insert("sliding_window_pattern".into(), json!(t.swa_pattern));
            if let Some(theta) = t.rope_local_theta {
                map.insert("rope_local_base_freq".into(), json!(theta));
            }
        }
        map.insert("sliding_window".into(), json!(t.sliding_window));
    }
    value
}

/// The `tokenizer.json` of a synthetic vocabulary (Hugging Face
/// `tokenizers` format: byte-level BPE with GPT-2's pre-tokenizer).
pub fn tokenizer_json(vocab: &SyntheticVocab) -> Value {
    let special_from = vocab.tokens.len().saturating_sub(SPECIAL_TOKENS.len());
    let added: Vec<Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .skip(special_from)
        .map(|(id, content)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let ids: serde_json::Map<String, Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), json!(id)))
        .collect();
    let merges: Vec<String> = vocab
        .merges
        .iter()
        .map(|(a, b)| format!("{a} {b}"))
        .collect();
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": ids, "merges": merges
        }
    })
}

fn tokenizer_config_json(vocab: &SyntheticVocab, context_length: usize) -> Value {
    let special_from = vocab.tokens.len().saturating_sub(SPECIAL_TOKENS.len());
    let decoder: serde_json::Map<String, Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .skip(special_from)
        .map(|(id, content)| {
            (
                id.to_string(),
                json!({ "content": content, "lstrip": false, "normalized": false,
                        "rstrip": false, "single_word": false, "special": true }),
            )
        })
        .collect();
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "added_tokens_decoder": decoder,
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[2],
        "pad_token": SPECIAL_TOKENS[0],
        "unk_token": null,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "model_max_length": context_length,
        "tokenizer_class": "GPT2Tokenizer",
    })
}
