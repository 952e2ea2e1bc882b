//! [`ModelConfig`] from GGUF metadata (`{arch}.embedding_length`, ...).

use switchyard_kernels::{DType, RopeStyle};

use super::rope_freqs::llama3_from_divisors;
use super::GgufFile;
use crate::formats::FormatError;
use crate::model::config::{Activation, Architecture, FamilyTraits, ModelConfig, RopeScaling};

/// Reads the model configuration of a GGUF file. Validation against the
/// tensors happens in [`crate::formats::load_checkpoint`].
pub fn model_config(file: &GgufFile) -> Result<ModelConfig, FormatError> {
    let meta = Keys { file };
    let arch_name = meta.string("general.architecture")?;
    let architecture =
        Architecture::from_name(arch_name).ok_or_else(|| FormatError::UnsupportedArchitecture {
            path: file.path().to_path_buf(),
            name: arch_name.to_string(),
        })?;
    let key = |suffix: &str| format!("{arch_name}.{suffix}");

    let hidden_size = meta.count(&key("embedding_length"))?;
    let n_heads = meta.count(&key("attention.head_count"))?;
    let n_kv_heads = meta.count_or(&key("attention.head_count_kv"), n_heads)?;
    let head_dim = meta.count_or(&key("attention.key_length"), hidden_size / n_heads.max(1))?;
    let rope_theta = meta.float_or(&key("rope.freq_base"), 10_000.0)?;
    let context_length = meta.count(&key("context_length"))?;

    let token_embd =
        file.tensors()
            .get("token_embd.weight")
            .ok_or_else(|| FormatError::MissingTensor {
                path: file.path().to_path_buf(),
                tensor: "token_embd.weight".into(),
            })?;
    let vocab_size = token_embd.shape.first().copied().unwrap_or(0);

    let rope_scaling = rope_scaling(file, &meta, arch_name, rope_theta, head_dim)?;
    let n_layers = meta.count(&key("block_count"))?;
    let traits = family_traits(
        &meta,
        architecture,
        arch_name,
        hidden_size,
        n_heads,
        head_dim,
        n_layers,
    )?;
    if architecture == Architecture::Phi3 && file.tensors().contains_key("rope_factors_long.weight")
    {
        return Err(FormatError::BadConfig {
            path: file.path().to_path_buf(),
            key: "rope_factors_long.weight".into(),
            reason: "is present: this Phi-3 file uses LongRoPE (a 128k-context variant), which \
                     Switchyard does not support; use a 4k-context Phi-3 checkpoint"
                .into(),
        });
    }
    let intermediate_size = meta.count(&key("feed_forward_length"))?;
    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        context_length,
        rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta,
        rope_scaling,
        // llama.cpp's converter permutes Llama/Mistral Q and K rows so that
        // rotary pairs are adjacent; the other families keep Hugging Face's
        // halves.
        rope_style: match architecture {
            Architecture::Llama | Architecture::Mistral => RopeStyle::Interleaved,
            _ => RopeStyle::Neox,
        },
        tied_embeddings: !file.tensors().contains_key("output.weight"),
        qkv_bias: file.tensors().contains_key("blk.0.attn_q.bias"),
        traits,
    })
}

/// The family's traits from GGUF metadata and llama.cpp's conventions for
/// what the metadata leaves out.
fn family_traits(
    meta: &Keys<'_>,
    architecture: Architecture,
    arch: &str,
    hidden_size: usize,
    n_heads: usize,
    head_dim: usize,
    n_layers: usize,
) -> Result<FamilyTraits, FormatError> {
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let optional_float = |k: &str| -> Result<Option<f32>, FormatError> {
        match meta.file.metadata().get(k) {
            None => Ok(None),
            Some(_) => meta.float(k).map(Some),
        }
    };
    let window = match meta.file.metadata().get(&key("attention.sliding_window")) {
        None => None,
        Some(_) => Some(meta.count(&key("attention.sliding_window"))?).filter(|w| *w > 0),
    };
    let mut traits = FamilyTraits {
        sliding_window: window,
        ..FamilyTraits::default()
    };
    match architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Phi3 => {}
        Architecture::Qwen3 => {
            traits.qk_norm = true;
            // Qwen3 checkpoints declare a window they do not use.
            traits.sliding_window = None;
        }
        Architecture::Gemma2 | Architecture::Gemma3 => {
            let gemma3 = architecture == Architecture::Gemma3;
            traits.activation = Activation::GeluTanh;
            traits.embed_scale = Some((hidden_size as f32).sqrt());
            traits.post_norms = true;
            traits.qk_norm = gemma3;
            // GGUF has no query_pre_attn_scalar: llama.cpp scales by
            // 1/√head_dim, except for the 27B models (46 and 62 layers),
            // whose scalar is hidden_size / n_heads.
            let big = n_layers == if gemma3 { 62 } else { 46 };
            let scalar = if big {
                hidden_size / n_heads.max(1)
            } else {
                head_dim
            };
            traits.attn_scale = Some(1.0 / (scalar as f32).sqrt());
            traits.attn_softcap = optional_float(&key("attention.logit_softcapping"))?;
            traits.final_softcap = optional_float(&key("final_logit_softcapping"))?;
            traits.swa_pattern = match meta
                .file
                .metadata()
                .get(&key("attention.sliding_window_pattern"))
            {
                Some(_) => meta.count(&key("attention.sliding_window_pattern"))?,
                None if gemma3 => 6,
                None => 2,
            };
            if gemma3 {
                traits.rope_local_theta =
                    Some(meta.float_or(&key("rope.freq_base_swa"), 10_000.0)?);
            }
        }
    }
    Ok(traits)
}

fn rope_scaling(
    file: &GgufFile,
    meta: &Keys<'_>,
    arch: &str,
    theta: f32,
    head_dim: usize,
) -> Result<RopeScaling, FormatError> {
    let type_key = format!("{arch}.rope.scaling.type");
    let factor_key = format!("{arch}.rope.scaling.factor");
    match file.metadata().get_str(&type_key) {
        None | Some("none") => {}
        Some("linear") => {
            let factor = meta.float(&factor_key)?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(meta.bad(&factor_key, format!("is {factor}; it must be positive")));
            }
            return Ok(RopeScaling::Linear { factor });
        }
        Some(other) => {
            return Err(meta.bad(
                &type_key,
                format!("is '{other}'; Switchyard supports none, linear and Llama 3 scaling"),
            ))
        }
    }
    // Llama 3 files carry their scaling as a tensor of frequency divisors.
    let Ok(divisors) = file.tensor_data("rope_freqs.weight") else {
        return Ok(RopeScaling::None);
    };
    let bad = |reason: String| FormatError::BadTensor {
        path: file.path().to_path_buf(),
        tensor: "rope_freqs.weight".into(),
        reason,
    };
    if divisors.dtype != DType::F32 {
        return Err(bad(format!(
            "its type is {}; it must be f32",
            divisors.dtype
        )));
    }
    let values: Vec<f32> = divisors
        .data
        .chunks_exact(4)
        .map(|c| <[u8; 4]>::try_from(c).map_or(f32::NAN, f32::from_le_bytes))
        .collect();
    let original = meta.count_or(
        &format!("{arch}.rope.scaling.original_context_length"),
        8192,
    )?;
    llama3_from_divisors(&values, theta, head_dim, original).map_err(bad)
}

/// Typed metadata look-ups whose errors name the file and the key.
struct Keys<'a> {
    file: &'a GgufFile,
}

impl Keys<'_> {
    fn bad(&self, key: &str, reason: String) -> FormatError {
        FormatError::BadConfig {
            path: self.file.path().to_path_buf(),
            key: key.to_string(),
            reason,
        }
    }

    fn missing(&self, key: &str) -> FormatError {
        self.bad(
            key,
            "is missing from the GGUF metadata; the file was not converted for a supported \
             architecture"
                .into(),
        )
    }

    fn string(&self, key: &str) -> Result<&str, FormatError> {
        match self.file.metadata().get(key) {
            None => Err(self.missing(key)),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.bad(key, format!("is a {}, not a string", v.type_name()))),
        }
    }

    fn count_or(&self, key: &str, default: usize) -> Result<usize, FormatError> {
        match self.file.metadata().get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.bad(key, format!("is {v:?}, not a non-negative integer"))),
        }
    }

    fn count(&self, key: &str) -> Result<usize, FormatError> {
        if self.file.metadata().get(key).is_none() {
            return Err(self.missing(key));
        }
        self.count_or(key, 0)
    }

    fn float_or(&self, key: &str, default: f32) -> Result<f32, FormatError> {
        match self.file.metadata().get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| self.bad(key, format!("is {v:?}, not a number"))),
        }
    }

    fn float(&self, key: &str) -> Result<f32, FormatError> {
        if self.file.metadata().get(key).is_none() {
            return Err(self.missing(key));
        }
        self.float_or(key, 0.0)
    }
}
