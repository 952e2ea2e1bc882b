//! PEFT's adapter folder: `adapter_config.json` (`r`, `lora_alpha`,
//! `target_modules`, `rank_pattern`, `alpha_pattern`, `use_rslora`) and
//! `adapter_model.safetensors`, tensors named
//! `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use serde::Deserialize;

use super::order::RowOrder;
use super::target::Target;
use super::weights::{AdapterFormat, AdapterWeights, Collector, RawPair};
use super::AdapterError;
use crate::formats::safetensors::shard_tensors;
use crate::formats::{Checkpoint, TensorData};

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The fields of `adapter_config.json` that change the arithmetic; a
/// field that asks for something Switchyard does not do is refused.
#[derive(Deserialize)]
struct PeftConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    #[serde(default)]
    lora_alpha: Option<f32>,
    #[serde(default)]
    target_modules: Option<serde_json::Value>,
    #[serde(default)]
    rank_pattern: BTreeMap<String, usize>,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, f32>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    modules_to_save: Option<serde_json::Value>,
}

/// Loads a PEFT folder against `base`.
pub fn load(dir: &Path, base: &Checkpoint) -> Result<AdapterWeights, AdapterError> {
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(|source| AdapterError::Io {
        path: config_path.clone(),
        source,
    })?;
    let bad = |reason: String| AdapterError::BadConfig {
        path: config_path.clone(),
        reason,
    };
    let cfg: PeftConfig =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a PEFT LoRA config: {e}")))?;
    check_config(&cfg, &config_path)?;

    let weights_path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&weights_path).map_err(|source| AdapterError::Io {
        path: weights_path.clone(),
        source,
    })?;
    let mut tensors = BTreeMap::new();
    shard_tensors(
        Bytes::from(bytes),
        &weights_path,
        base.config.architecture,
        &mut tensors,
    )?;

    let base_order = match base.config.rope_style {
        switchyard_kernels::RopeStyle::Interleaved => RowOrder::Pairs,
        switchyard_kernels::RopeStyle::Neox => RowOrder::Halves,
    };
    let mut collector = Collector::new(&weights_path, &base.config, RowOrder::Halves, base_order);
    for (name, a) in &tensors {
        let Some(module) = name.strip_suffix(".lora_A.weight") else {
            if name.contains(".lora_B.") {
                continue; // taken with its A
            }
            return Err(AdapterError::BadTensor {
                path: weights_path.clone(),
                tensor: name.clone(),
                reason: "is not a LoRA A or B weight (a DoRA magnitude, an embedding \
                         or a saved module are not supported)"
                    .into(),
            });
        };
        let (layer, target) = parse_module(module, &weights_path)?;
        let b_name = format!("{module}.lora_B.weight");
        let b: &TensorData = tensors
            .get(&b_name)
            .ok_or_else(|| AdapterError::MissingPair {
                path: weights_path.clone(),
                tensor: name.clone(),
                missing: b_name.clone(),
            })?;
        let key = module.strip_prefix("base_model.model.").unwrap_or(module);
        let alpha = pattern(&cfg.alpha_pattern, key)
            .or(cfg.lora_alpha)
            .unwrap_or(8.0);
        let declared = pattern(&cfg.rank_pattern, key).unwrap_or(cfg.r);
        collector.add(RawPair {
            layer,
            target,
            a_name: name,
            a,
            b_name: &b_name,
            b,
            alpha,
            rs_lora: cfg.use_rslora,
            declared_rank: Some(declared),
        })?;
    }
    for name in tensors.keys().filter(|n| n.ends_with(".lora_B.weight")) {
        let a_name = name.replace(".lora_B.weight", ".lora_A.weight");
        if !tensors.contains_key(&a_name) {
            return Err(AdapterError::MissingPair {
                path: weights_path.clone(),
                tensor: name.clone(),
                missing: a_name,
            });
        }
    }
    collector.finish(AdapterFormat::Peft)
}

fn check_config(cfg: &PeftConfig, path: &Path) -> Result<(), AdapterError> {
    let refuse = |reason: &str| {
        Err(AdapterError::BadConfig {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        })
    };
    if cfg.peft_type.as_deref().is_some_and(|t| t != "LORA") {
        return refuse("peft_type is not LORA; only LoRA adapters are served");
    }
    if cfg.r == 0 {
        return Err(AdapterError::RankZero {
            path: path.to_path_buf(),
            tensor: "r".into(),
        });
    }
    if cfg.use_dora {
        return refuse("use_dora is true; DoRA adapters are not supported (merge it instead)");
    }
    if cfg.fan_in_fan_out {
        return refuse("fan_in_fan_out is true (GPT-2 style Conv1D weights); not supported");
    }
    if cfg.bias.as_deref().is_some_and(|b| b != "none") {
        return refuse("bias is not \"none\"; adapters that train biases are not supported");
    }
    if cfg
        .modules_to_save
        .as_ref()
        .is_some_and(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty()))
    {
        return refuse("modules_to_save is set; adapters carrying full weights are not supported");
    }
    if let Some(list) = cfg.target_modules.as_ref().and_then(|t| t.as_array()) {
        for target in list {
            let name = target.as_str().unwrap_or_default();
            if Target::from_peft(name).is_none() {
                return Err(AdapterError::UnknownTarget {
                    path: path.to_path_buf(),
                    target: name.to_string(),
                });
            }
        }
    }
    for key in cfg.rank_pattern.keys().chain(cfg.alpha_pattern.keys()) {
        if key.chars().any(|c| "*?[](){}|^$\\+".contains(c)) {
            return refuse(&format!(
                "pattern '{key}' is a regular expression; rank_pattern and alpha_pattern \
                 keys must be module names or name suffixes"
            ));
        }
    }
    Ok(())
}

/// `model.layers.3.self_attn.q_proj` (after PEFT's wrapper prefix) → (3, Q).
fn parse_module(module: &str, path: &Path) -> Result<(usize, Target), AdapterError> {
    let unknown = || AdapterError::UnknownTarget {
        path: path.to_path_buf(),
        target: module.to_string(),
    };
    let (_, rest) = module.split_once("layers.").ok_or_else(unknown)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    let last = rest.rsplit('.').next().unwrap_or(rest);
    let target = Target::from_peft(last).ok_or_else(|| AdapterError::UnknownTarget {
        path: path.to_path_buf(),
        target: last.to_string(),
    })?;
    Ok((layer, target))
}

/// The value of the longest key of `patterns` that is `module` or a
/// dot-separated suffix of it (PEFT matches keys as name suffixes).
fn pattern<T: Copy>(patterns: &BTreeMap<String, T>, module: &str) -> Option<T> {
    patterns
        .iter()
        .filter(|(k, _)| module == k.as_str() || module.ends_with(&format!(".{k}")))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_name_suffixes() {
        let p: BTreeMap<String, usize> = [
            ("q_proj".to_string(), 4),
            ("layers.1.self_attn.q_proj".to_string(), 2),
        ]
        .into();
        assert_eq!(pattern(&p, "model.layers.0.self_attn.q_proj"), Some(4));
        assert_eq!(pattern(&p, "model.layers.1.self_attn.q_proj"), Some(2));
        assert_eq!(pattern(&p, "model.layers.1.self_attn.xq_proj"), None);
    }

    #[test]
    fn modules_parse_to_layer_and_target() {
        let p = Path::new("x");
        let (l, t) = parse_module("base_model.model.model.layers.12.mlp.down_proj", p).unwrap();
        assert_eq!((l, t), (12, Target::Down));
        assert!(parse_module("base_model.model.lm_head", p).is_err());
        assert!(parse_module("base_model.model.model.layers.0.mlp.fc9", p).is_err());
    }
}
