//! The synthetic model shapes: one small preset per supported family.

use switchyard_kernels::RopeStyle;

use crate::formats::CheckpointFormat;
use crate::model::config::{Architecture, ModelConfig, RopeScaling};

/// A family of synthetic model. All share small dimensions that every
/// tensor type can hold (rows of 256 elements, the K-quant block), and
/// differ where their families differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// Llama 2 style: full multi-head attention, untied, theta 10 000.
    Llama,
    /// Llama 3.1 style: GQA, theta 500 000, Llama 3 rope scaling.
    Llama3,
    /// SmolLM2 style: GQA, tied embeddings.
    Smollm2,
    /// TinyLlama style: GQA with 4 query heads per KV head.
    Tinyllama,
    /// Mistral style: GQA, theta 1 000 000.
    Mistral,
    /// Qwen2 style: GQA, biases on Q, K and V, Neox rope even in GGUF.
    Qwen2,
}

impl Preset {
    /// Every preset, for tests.
    pub const ALL: [Preset; 6] = [
        Preset::Llama,
        Preset::Llama3,
        Preset::Smollm2,
        Preset::Tinyllama,
        Preset::Mistral,
        Preset::Qwen2,
    ];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            Preset::Llama => "llama",
            Preset::Llama3 => "llama3",
            Preset::Smollm2 => "smollm2",
            Preset::Tinyllama => "tinyllama",
            Preset::Mistral => "mistral",
            Preset::Qwen2 => "qwen2",
        }
    }

    /// Parses [`Preset::name`].
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// The architecture a Hugging Face folder declares (`model_type`).
    pub const fn hf_architecture(self) -> Architecture {
        match self {
            Preset::Mistral => Architecture::Mistral,
            Preset::Qwen2 => Architecture::Qwen2,
            _ => Architecture::Llama,
        }
    }

    /// The architecture a GGUF file declares: llama.cpp converts Mistral
    /// models as `llama`, and so do we, so llama.cpp can read our files.
    pub const fn gguf_architecture(self) -> Architecture {
        match self {
            Preset::Qwen2 => Architecture::Qwen2,
            _ => Architecture::Llama,
        }
    }

    /// The configuration a loader reads back from this preset written in `format`.
    pub fn config(self, format: CheckpointFormat) -> ModelConfig {
        let (n_kv_heads, rope_theta, rms_norm_eps) = match self {
            Preset::Llama => (4, 10_000.0, 1e-5),
            Preset::Llama3 => (2, 500_000.0, 1e-5),
            Preset::Smollm2 => (2, 100_000.0, 1e-5),
            Preset::Tinyllama => (1, 10_000.0, 1e-5),
            Preset::Mistral => (2, 1_000_000.0, 1e-5),
            Preset::Qwen2 => (2, 1_000_000.0, 1e-6),
        };
        let (architecture, rope_style) = match format {
            CheckpointFormat::Gguf => (
                self.gguf_architecture(),
                match self {
                    Preset::Qwen2 => RopeStyle::Neox,
                    _ => RopeStyle::Interleaved,
                },
            ),
            CheckpointFormat::Safetensors => (self.hf_architecture(), RopeStyle::Neox),
        };
        ModelConfig {
            architecture,
            vocab_size: 320,
            hidden_size: 256,
            intermediate_size: 512,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads,
            head_dim: 64,
            context_length: 256,
            rms_norm_eps,
            rope_theta,
            // Scaled down from Llama 3.1 (factor 8, 8192 tokens) so that
            // this small head has frequencies in all three bands.
            rope_scaling: match self {
                Preset::Llama3 => RopeScaling::Llama3 {
                    factor: 4.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context_length: 64,
                },
                _ => RopeScaling::None,
            },
            rope_style,
            tied_embeddings: self == Preset::Smollm2,
            qkv_bias: self == Preset::Qwen2,
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
