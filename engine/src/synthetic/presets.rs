//! The synthetic model shapes: one small preset per supported family.

use switchyard_kernels::RopeStyle;

use crate::formats::CheckpointFormat;
use crate::model::config::{Activation, Architecture, FamilyTraits, ModelConfig, RopeScaling};

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
    /// Qwen3 style: per-head query and key norms, no biases.
    Qwen3,
    /// Gemma 2 style: √d embeddings, post norms, GeGLU, local and global
    /// layers alternating (a window of 16), soft-capped scores and logits.
    Gemma2,
    /// Gemma 3 style: query/key norms, a local layer (window 16, RoPE base
    /// 10 000) then a global one (base 1 000 000).
    Gemma3,
    /// Phi-3 style: fused QKV and gate/up, a sliding window of 24.
    Phi3,
}

impl Preset {
    /// Every preset, for tests.
    pub const ALL: [Preset; 10] = [
        Preset::Llama,
        Preset::Llama3,
        Preset::Smollm2,
        Preset::Tinyllama,
        Preset::Mistral,
        Preset::Qwen2,
        Preset::Qwen3,
        Preset::Gemma2,
        Preset::Gemma3,
        Preset::Phi3,
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
            Preset::Qwen3 => "qwen3",
            Preset::Gemma2 => "gemma2",
            Preset::Gemma3 => "gemma3",
            Preset::Phi3 => "phi3",
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
            Preset::Qwen3 => Architecture::Qwen3,
            Preset::Gemma2 => Architecture::Gemma2,
            Preset::Gemma3 => Architecture::Gemma3,
            Preset::Phi3 => Architecture::Phi3,
            _ => Architecture::Llama,
        }
    }

    /// The architecture a GGUF file declares: llama.cpp converts Mistral
    /// models as `llama`, and so do we, so llama.cpp can read our files.
    pub const fn gguf_architecture(self) -> Architecture {
        match self {
            Preset::Llama
            | Preset::Llama3
            | Preset::Smollm2
            | Preset::Tinyllama
            | Preset::Mistral => Architecture::Llama,
            _ => self.hf_architecture(),
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
            Preset::Qwen2 | Preset::Qwen3 => (2, 1_000_000.0, 1e-6),
            Preset::Gemma2 => (2, 10_000.0, 1e-6),
            Preset::Gemma3 => (1, 1_000_000.0, 1e-6),
            Preset::Phi3 => (4, 10_000.0, 1e-5),
        };
        let (architecture, rope_style) = match format {
            CheckpointFormat::Gguf => (
                self.gguf_architecture(),
                match self.gguf_architecture() {
                    Architecture::Llama => RopeStyle::Interleaved,
                    _ => RopeStyle::Neox,
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
            tied_embeddings: matches!(self, Preset::Smollm2 | Preset::Gemma2 | Preset::Gemma3),
            qkv_bias: self == Preset::Qwen2,
            traits: self.traits(format),
        }
    }

    /// What the family changes, as a loader reads it back from `format`.
    fn traits(self, format: CheckpointFormat) -> FamilyTraits {
        let base = FamilyTraits::default();
        let gemma = |gemma3: bool| FamilyTraits {
            activation: Activation::GeluTanh,
            embed_scale: Some(16.0),
            post_norms: true,
            qk_norm: gemma3,
            attn_scale: Some(0.125),
            // Small caps, so that capping changes the numbers.
            attn_softcap: (!gemma3).then_some(5.0),
            final_softcap: (!gemma3).then_some(5.0),
            sliding_window: Some(16),
            swa_pattern: 2,
            rope_local_theta: gemma3.then_some(10_000.0),
            norm_offset: if format == CheckpointFormat::Safetensors {
                1.0
            } else {
                0.0
            },
        };
        match self {
            Preset::Mistral if format == CheckpointFormat::Safetensors => FamilyTraits {
                sliding_window: Some(24),
                ..base
            },
            Preset::Qwen3 => FamilyTraits {
                qk_norm: true,
                ..base
            },
            Preset::Gemma2 => gemma(false),
            Preset::Gemma3 => gemma(true),
            Preset::Phi3 => FamilyTraits {
                sliding_window: Some(24),
                ..base
            },
            _ => base,
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
