//! Every synthetic preset × tensor type loads back in both formats with the
//! configuration and shapes it was written with; the real SmolLM2 file
//! loads with its known configuration.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;

use switchyard_engine::formats::gguf::GgufFile;
use switchyard_engine::formats::{
    expected_tensors, load_checkpoint, CheckpointFormat, TokenizerSource,
};
use switchyard_engine::model::config::{Architecture, ModelConfig};
use switchyard_engine::synthetic::{write_gguf, write_safetensors, Preset, SyntheticSpec};
use switchyard_kernels::{DType, RopeStyle};

/// Compares configurations; rope scaling read back from GGUF is recovered
/// from f32 divisors, so it is compared through the frequencies it yields.
fn assert_same_config(actual: &ModelConfig, expected: &ModelConfig, what: &str) {
    let strip = |c: &ModelConfig| ModelConfig {
        rope_scaling: switchyard_engine::model::config::RopeScaling::None,
        ..c.clone()
    };
    assert_eq!(strip(actual), strip(expected), "{what}");
    let (a, e) = (actual.rope_inv_freq(), expected.rope_inv_freq());
    for (x, y) in a.iter().zip(&e) {
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "{what}: inv_freq {a:?} vs {e:?}"
        );
    }
}

#[test]
fn every_preset_and_type_loads_from_gguf() {
    let dir = tempfile::tempdir().unwrap();
    for preset in Preset::ALL {
        for dtype in DType::ALL {
            let spec = SyntheticSpec {
                preset,
                dtype,
                seed: 7,
            };
            let path = dir.path().join(format!("{preset}-{dtype}.gguf"));
            write_gguf(&spec, &path).unwrap();
            let what = format!("{preset} {dtype} gguf");
            let ckpt = load_checkpoint(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(ckpt.format, CheckpointFormat::Gguf);
            let expected = preset.config(CheckpointFormat::Gguf);
            assert_same_config(&ckpt.config, &expected, &what);
            for (name, shape) in expected_tensors(&expected) {
                let t = &ckpt.tensors[&name];
                assert_eq!(t.shape, shape, "{what}: {name}");
                let want = if shape.len() == 1 { DType::F32 } else { dtype };
                assert_eq!(t.dtype, want, "{what}: {name}");
            }
            assert!(matches!(ckpt.tokenizer, TokenizerSource::Gguf { .. }));
            // Writing is deterministic.
            let again = dir.path().join("again.gguf");
            write_gguf(&spec, &again).unwrap();
            assert_eq!(
                std::fs::read(&path).unwrap(),
                std::fs::read(&again).unwrap()
            );
        }
    }
}

#[test]
fn every_preset_and_float_type_loads_from_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    for preset in Preset::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for shards in [1, 2] {
                let spec = SyntheticSpec {
                    preset,
                    dtype,
                    seed: 3,
                };
                let folder = dir.path().join(format!("{preset}-{dtype}-{shards}"));
                write_safetensors(&spec, &folder, shards).unwrap();
                let what = format!("{preset} {dtype} safetensors ×{shards}");
                let ckpt = load_checkpoint(&folder).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(ckpt.format, CheckpointFormat::Safetensors);
                let expected = preset.config(CheckpointFormat::Safetensors);
                assert_same_config(&ckpt.config, &expected, &what);
                assert_eq!(ckpt.config.rope_style, RopeStyle::Neox);
                for (name, shape) in expected_tensors(&expected) {
                    let t = &ckpt.tensors[&name];
                    assert_eq!((&t.shape, t.dtype), (&shape, dtype), "{what}: {name}");
                }
                assert_eq!(
                    folder.join("model.safetensors.index.json").exists(),
                    shards == 2
                );
                let TokenizerSource::HuggingFace {
                    tokenizer_json,
                    tokenizer_config,
                } = &ckpt.tokenizer
                else {
                    panic!("{what}: expected a Hugging Face tokenizer");
                };
                assert!(tokenizer_json.is_file() && tokenizer_config.is_some());
            }
        }
    }
}

/// Same preset and seed: the GGUF f32 file is the safetensors f32 model with
/// Q and K rows permuted for interleaved rope (Llama) or unchanged (Qwen2).
#[test]
fn gguf_and_safetensors_hold_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    for preset in [Preset::Llama3, Preset::Qwen2] {
        let spec = SyntheticSpec {
            preset,
            dtype: DType::F32,
            seed: 11,
        };
        let (gguf, hf) = (dir.path().join("m.gguf"), dir.path().join("m"));
        write_gguf(&spec, &gguf).unwrap();
        write_safetensors(&spec, &hf, 1).unwrap();
        let (g, h) = (
            load_checkpoint(&gguf).unwrap(),
            load_checkpoint(&hf).unwrap(),
        );
        for (name, _) in expected_tensors(&g.config) {
            let same = g.tensors[&name].data == h.tensors[&name].data;
            let permuted = name.contains("attn_q.") || name.contains("attn_k.");
            assert_eq!(
                same,
                !permuted || preset == Preset::Qwen2,
                "{preset}: {name}"
            );
        }
    }
}

/// The real model fetched by scripts/fetch-model.sh.
#[test]
fn real_smollm2_gguf_has_its_known_config() {
    let path = real_models::smollm2();
    let ckpt = load_checkpoint(&path).unwrap();
    let c = &ckpt.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads),
        (30, 576, 9, 3)
    );
    assert_eq!(
        (c.intermediate_size, c.vocab_size, c.head_dim),
        (1536, 49152, 64)
    );
    assert!(c.tied_embeddings && !c.qkv_bias);
    assert_eq!(c.rope_style, RopeStyle::Interleaved);
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(
        file.metadata().get_str("tokenizer.ggml.model"),
        Some("gpt2")
    );
    // Every tensor's bytes are reachable, zero-copy.
    for name in file.tensors().keys() {
        let t = file.tensor_data(name).unwrap();
        assert_eq!(
            Some(t.data.len()),
            t.dtype.bytes_for(t.shape.iter().product())
        );
    }
}
