//! [`ModelConfig`] from a Hugging Face `config.json`.

use std::path::Path;

use serde::Deserialize;
use switchyard_kernels::RopeStyle;

use crate::formats::FormatError;
use crate::model::config::{Activation, Architecture, FamilyTraits, ModelConfig, RopeScaling};

/// The fields of `config.json` Switchyard reads; the rest are ignored.
#[derive(Debug, Deserialize)]
struct HfConfig {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    // Gemma, Mistral, Qwen.
    hidden_activation: Option<String>,
    hidden_act: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    use_sliding_window: Option<bool>,
    rope_local_base_freq: Option<f64>,
}

/// Just the family of a `config.json` (tensor names depend on it).
pub(super) fn architecture(text: &str, path: &Path) -> Result<Architecture, FormatError> {
    #[derive(Deserialize)]
    struct Family {
        model_type: Option<String>,
    }
    let family: Family = serde_json::from_str(text).map_err(|source| FormatError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    let model_type = family.model_type.ok_or_else(|| FormatError::BadConfig {
        path: path.to_path_buf(),
        key: "model_type".into(),
        reason: format!(
            "is missing; expected one of {}",
            Architecture::supported_list()
        ),
    })?;
    Architecture::from_name(&model_type).ok_or_else(|| FormatError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        name: model_type,
    })
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    /// Newer configs say `rope_type`, older ones `type`; some say both.
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

/// Parses `config.json` text read from `path`. `has_qkv_bias` comes from
/// the weights (Qwen2 always has the biases; Llama only with
/// `attention_bias`, which the weights show just as well).
pub(super) fn parse_config(
    text: &str,
    path: &Path,
    has_qkv_bias: bool,
) -> Result<ModelConfig, FormatError> {
    let hf: HfConfig = serde_json::from_str(text).map_err(|source| FormatError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |key: &str, reason: &str| FormatError::BadConfig {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.to_string(),
    };
    let required = |value: Option<usize>, key: &str| {
        value.ok_or_else(|| bad(key, "is missing; config.json must give it"))
    };
    let architecture = architecture(text, path)?;
    let hidden_size = required(hf.hidden_size, "hidden_size")?;
    let n_heads = required(hf.num_attention_heads, "num_attention_heads")?;
    let rope_scaling = match &hf.rope_scaling {
        None => RopeScaling::None,
        Some(s) => rope_scaling(s, path)?,
    };
    let head_dim = hf.head_dim.unwrap_or(hidden_size / n_heads.max(1));
    let traits = family_traits(&hf, architecture, head_dim, path)?;
    Ok(ModelConfig {
        architecture,
        vocab_size: required(hf.vocab_size, "vocab_size")?,
        hidden_size,
        intermediate_size: required(hf.intermediate_size, "intermediate_size")?,
        n_layers: required(hf.num_hidden_layers, "num_hidden_layers")?,
        n_heads,
        n_kv_heads: hf.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        // Transformers' defaults for these model types.
        context_length: hf.max_position_embeddings.unwrap_or(2048),
        rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6) as f32,
        rope_theta: hf.rope_theta.unwrap_or(10_000.0) as f32,
        rope_scaling,
        // Hugging Face keeps Q and K in their original order: rotary pairs
        // are the two halves of each head.
        rope_style: RopeStyle::Neox,
        // Gemma ties them unless it says otherwise.
        tied_embeddings: hf.tie_word_embeddings.unwrap_or(architecture.is_gemma()),
        qkv_bias: has_qkv_bias,
        traits,
    })
}

fn family_traits(
    hf: &HfConfig,
    architecture: Architecture,
    head_dim: usize,
    path: &Path,
) -> Result<FamilyTraits, FormatError> {
    let bad = |key: &str, reason: String| FormatError::BadConfig {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason,
    };
    let float = |v: Option<f64>| v.map(|v| v as f32);
    let mut traits = FamilyTraits::default();
    let activation = hf.hidden_activation.as_deref().or(hf.hidden_act.as_deref());
    match architecture {
        Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Phi3 => {
            if hf.use_sliding_window == Some(true) {
                return Err(bad(
                    "use_sliding_window",
                    "is true; Switchyard applies sliding windows to Mistral, Phi-3 and Gemma \
                     only"
                        .into(),
                ));
            }
            traits.qk_norm = architecture == Architecture::Qwen3;
            if architecture == Architecture::Phi3 {
                traits.sliding_window = hf.sliding_window;
            }
        }
        Architecture::Mistral => traits.sliding_window = hf.sliding_window,
        Architecture::Gemma2 | Architecture::Gemma3 => {
            let gemma3 = architecture == Architecture::Gemma3;
            match activation {
                None | Some("gelu_pytorch_tanh") | Some("gelu_tanh") => {}
                Some(other) => {
                    return Err(bad(
                        "hidden_activation",
                        format!("is '{other}'; Gemma checkpoints use gelu_pytorch_tanh"),
                    ))
                }
            }
            traits.activation = Activation::GeluTanh;
            traits.embed_scale = hf.hidden_size.map(|h| (h as f32).sqrt());
            traits.post_norms = true;
            traits.qk_norm = gemma3;
            let scalar = hf.query_pre_attn_scalar.unwrap_or(head_dim as f64);
            traits.attn_scale = Some((1.0 / scalar.sqrt()) as f32);
            traits.attn_softcap = float(hf.attn_logit_softcapping);
            traits.final_softcap = float(hf.final_logit_softcapping);
            traits.sliding_window = hf.sliding_window;
            traits.swa_pattern = match (&hf.layer_types, hf.sliding_window_pattern) {
                (Some(types), _) => pattern_of(types).map_err(|r| bad("layer_types", r))?,
                (None, Some(n)) => n,
                (None, None) if gemma3 => 6,
                (None, None) => 2,
            };
            // Hugging Face stores Gemma's norm weights as `w` and scales by
            // `1 + w`; the forward pass takes the scale itself.
            traits.norm_offset = 1.0;
            if gemma3 {
                traits.rope_local_theta = Some(float(hf.rope_local_base_freq).unwrap_or(10_000.0));
            }
        }
    }
    Ok(traits)
}

/// The local/global period of `layer_types` (`sliding_attention` ×
/// (n − 1), then `full_attention`, repeated): the period or why not.
fn pattern_of(types: &[String]) -> Result<usize, String> {
    let n = types
        .iter()
        .position(|t| t == "full_attention")
        .map_or(0, |i| i + 1);
    let expected = |i: usize| {
        if n > 0 && i % n == n - 1 {
            "full_attention"
        } else {
            "sliding_attention"
        }
    };
    match types
        .iter()
        .enumerate()
        .find(|(i, t)| t.as_str() != expected(*i))
    {
        None => Ok(n),
        Some((i, t)) => Err(format!(
            "layer {i} is '{t}'; Switchyard supports a repeating pattern of local layers \
             then one global layer"
        )),
    }
}

fn rope_scaling(s: &HfRopeScaling, path: &Path) -> Result<RopeScaling, FormatError> {
    let bad = |key: &str, reason: String| FormatError::BadConfig {
        path: path.to_path_buf(),
        key: format!("rope_scaling.{key}"),
        reason,
    };
    let number = |value: Option<f64>, key: &str| match value {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v as f32),
        Some(v) => Err(bad(key, format!("is {v}; it must be a positive number"))),
        None => Err(bad(key, "is missing".into())),
    };
    match s.rope_type.as_deref().or(s.legacy_type.as_deref()) {
        None | Some("default") => Ok(RopeScaling::None),
        Some("linear") => Ok(RopeScaling::Linear {
            factor: number(s.factor, "factor")?,
        }),
        Some("llama3") => {
            let low_freq_factor = number(s.low_freq_factor, "low_freq_factor")?;
            let high_freq_factor = number(s.high_freq_factor, "high_freq_factor")?;
            if high_freq_factor <= low_freq_factor {
                return Err(bad(
                    "high_freq_factor",
                    format!(
                        "is {high_freq_factor}; it must exceed low_freq_factor ({low_freq_factor})"
                    ),
                ));
            }
            Ok(RopeScaling::Llama3 {
                factor: number(s.factor, "factor")?,
                low_freq_factor,
                high_freq_factor,
                original_context_length: s
                    .original_max_position_embeddings
                    .ok_or_else(|| bad("original_max_position_embeddings", "is missing".into()))?,
            })
        }
        Some(other) => Err(bad(
            "rope_type",
            format!("is '{other}'; Switchyard supports default, linear and llama3 scaling"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3: &str = r#"{
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 131072, "tie_word_embeddings": false,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    }"#;

    #[test]
    fn reads_a_llama31_config() {
        let c = parse_config(LLAMA3, Path::new("config.json"), false).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (32, 8, 128));
        assert_eq!(c.rope_style, RopeStyle::Neox);
        assert!(
            matches!(c.rope_scaling, RopeScaling::Llama3 { factor, original_context_length: 8192, .. } if factor == 8.0)
        );
        c.validate().unwrap();
    }

    #[test]
    fn errors_name_the_key() {
        let text = LLAMA3.replace("\"hidden_size\": 4096,", "");
        let err = parse_config(&text, Path::new("m/config.json"), false).unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
        assert!(err.to_string().contains("m/config.json"), "{err}");
        let text = LLAMA3.replace("\"llama\"", "\"gpt2\"");
        let err = parse_config(&text, Path::new("config.json"), false).unwrap_err();
        assert!(err.to_string().contains("gpt2"), "{err}");
        let text = LLAMA3.replace("\"rope_type\"", "\"type\"");
        let c = parse_config(&text, Path::new("config.json"), false).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
        let text = LLAMA3.replace("\"llama3\"", "\"yarn\"");
        let err = parse_config(&text, Path::new("config.json"), false).unwrap_err();
        assert!(err.to_string().contains("yarn"), "{err}");
    }

    /// Gemma 3 270M's text config.json (abridged): layer_types gives five
    /// local layers per global one.
    const GEMMA3: &str = r#"{
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "max_position_embeddings": 32768, "query_pre_attn_scalar": 256,
        "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512,
        "final_logit_softcapping": null, "attn_logit_softcapping": null,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention"]
    }"#;

    #[test]
    fn reads_a_gemma3_text_config() {
        let c = parse_config(GEMMA3, Path::new("config.json"), false).unwrap();
        assert_eq!(c.architecture, Architecture::Gemma3);
        assert!(c.tied_embeddings, "Gemma ties embeddings by default");
        let t = &c.traits;
        assert_eq!(t.activation, Activation::GeluTanh);
        assert_eq!((t.sliding_window, t.swa_pattern), (Some(512), 6));
        assert_eq!(t.attn_scale, Some(1.0 / 16.0));
        assert_eq!((t.norm_offset, t.rope_local_theta), (1.0, Some(10_000.0)));
        assert_eq!(t.embed_scale, Some(640f32.sqrt()));
        let windows = c.layer_windows();
        assert_eq!(windows[4], Some(512));
        assert_eq!(windows[5], None);
        c.validate().unwrap();

        let odd = GEMMA3.replacen("\"sliding_attention\"", "\"full_attention\"", 1);
        let err = parse_config(&odd, Path::new("config.json"), false).unwrap_err();
        assert!(err.to_string().contains("layer_types"), "{err}");
        let gelu = GEMMA3.replace("gelu_pytorch_tanh", "relu");
        let err = parse_config(&gelu, Path::new("config.json"), false).unwrap_err();
        assert!(err.to_string().contains("relu"), "{err}");
    }
}
