//! llama.cpp's GGUF adapter: `general.type = adapter`, `adapter.type =
//! lora`, `adapter.lora.alpha`, and tensors `blk.N.<weight>.weight.lora_a`
//! (`rank × in`) and `.lora_b` (`out × rank`), as `convert_lora_to_gguf.py`
//! writes them (Q and K rows already permuted for a Llama base).

use std::path::Path;

use super::order::RowOrder;
use super::target::Target;
use super::weights::{AdapterFormat, AdapterWeights, Collector, RawPair};
use super::AdapterError;
use crate::formats::gguf::GgufFile;
use crate::formats::Checkpoint;
use crate::model::config::Architecture;

/// Whether an opened GGUF file says it is an adapter.
pub fn is_adapter(file: &GgufFile) -> bool {
    file.metadata().get_str("general.type") == Some("adapter")
}

/// Loads a GGUF adapter against `base`.
pub fn load(path: &Path, base: &Checkpoint) -> Result<AdapterWeights, AdapterError> {
    let file = GgufFile::open(path)?;
    let meta = file.metadata();
    let bad = |reason: String| AdapterError::BadConfig {
        path: path.to_path_buf(),
        reason,
    };
    if !is_adapter(&file) {
        return Err(AdapterError::NotAnAdapter {
            path: path.to_path_buf(),
        });
    }
    match meta.get_str("adapter.type") {
        Some("lora") => {}
        other => {
            return Err(bad(format!(
                "adapter.type is {other:?}; only \"lora\" adapters are served"
            )))
        }
    }
    let arch_name = meta.get_str("general.architecture").unwrap_or_default();
    let arch = Architecture::from_name(arch_name);
    if arch != Some(base.config.architecture) {
        return Err(AdapterError::WrongBase {
            path: path.to_path_buf(),
            adapter: format!("architecture '{arch_name}'"),
            base: format!("'{}'", base.config.architecture.name()),
        });
    }
    let alpha = match meta.get("adapter.lora.alpha") {
        None => 0.0,
        Some(v) => {
            v.as_f64()
                .ok_or_else(|| bad("adapter.lora.alpha is not a number".into()))? as f32
        }
    };
    // The converter permutes Q and K of the families whose GGUF RoPE is
    // interleaved (see `gguf::config`); the base's order follows its own.
    let pairs = |a: Architecture| matches!(a, Architecture::Llama | Architecture::Mistral);
    let file_order = if pairs(base.config.architecture) {
        RowOrder::Pairs
    } else {
        RowOrder::Halves
    };
    let base_order = match base.config.rope_style {
        switchyard_kernels::RopeStyle::Interleaved => RowOrder::Pairs,
        switchyard_kernels::RopeStyle::Neox => RowOrder::Halves,
    };
    let tensors = file.all_tensor_data()?;
    let mut collector = Collector::new(path, &base.config, file_order, base_order);
    for (name, a) in &tensors {
        let Some(weight) = name.strip_suffix(".lora_a") else {
            if name.ends_with(".lora_b") {
                continue;
            }
            return Err(AdapterError::BadTensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                reason: "is not a lora_a or lora_b tensor".into(),
            });
        };
        let (layer, target) = parse_weight(weight, path)?;
        let b_name = format!("{weight}.lora_b");
        let b = tensors
            .get(&b_name)
            .ok_or_else(|| AdapterError::MissingPair {
                path: path.to_path_buf(),
                tensor: name.clone(),
                missing: b_name.clone(),
            })?;
        collector.add(RawPair {
            layer,
            target,
            a_name: name,
            a,
            b_name: &b_name,
            b,
            alpha,
            rs_lora: false,
            declared_rank: None,
        })?;
    }
    for name in tensors.keys().filter(|n| n.ends_with(".lora_b")) {
        let a_name = format!("{}.lora_a", name.trim_end_matches(".lora_b"));
        if !tensors.contains_key(&a_name) {
            return Err(AdapterError::MissingPair {
                path: path.to_path_buf(),
                tensor: name.clone(),
                missing: a_name,
            });
        }
    }
    collector.finish(AdapterFormat::Gguf)
}

/// `blk.3.attn_q.weight` → (3, Q).
fn parse_weight(weight: &str, path: &Path) -> Result<(usize, Target), AdapterError> {
    let unknown = |target: &str| AdapterError::UnknownTarget {
        path: path.to_path_buf(),
        target: target.to_string(),
    };
    let rest = weight.strip_prefix("blk.").ok_or_else(|| unknown(weight))?;
    let (layer, rest) = rest.split_once('.').ok_or_else(|| unknown(weight))?;
    let layer: usize = layer.parse().map_err(|_| unknown(weight))?;
    let module = rest
        .strip_suffix(".weight")
        .ok_or_else(|| unknown(weight))?;
    let target = Target::from_gguf(module).ok_or_else(|| unknown(module))?;
    Ok((layer, target))
}
