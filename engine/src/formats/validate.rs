//! Checks that a checkpoint holds every tensor the Llama forward pass
//! needs, with the shapes its configuration implies.

use std::path::Path;

use super::{Checkpoint, FormatError, TensorData};
use crate::model::config::{Architecture, ModelConfig};

/// The tensors the forward pass reads and their shapes (outermost first),
/// derived from the configuration alone. Lazy, so a hostile layer count
/// costs nothing until tensors run out.
pub fn expected_tensors(config: &ModelConfig) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
    let (hidden, ffn, vocab) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    // Saturating: absurd configured sizes then simply fail to match.
    let q_dim = config.n_heads.saturating_mul(config.head_dim);
    let kv_dim = config.n_kv_heads.saturating_mul(config.head_dim);
    let mut globals = vec![
        ("token_embd.weight".to_string(), vec![vocab, hidden]),
        ("output_norm.weight".to_string(), vec![hidden]),
    ];
    if !config.tied_embeddings {
        globals.push(("output.weight".into(), vec![vocab, hidden]));
    }
    let fused = config.architecture == Architecture::Phi3;
    let traits = &config.traits;
    let (qk_norm, post_norms) = (traits.qk_norm, traits.post_norms);
    let head_dim = config.head_dim;
    let layers = (0..config.n_layers).flat_map(move |i| {
        // Llama's order (errors name the first mismatch), Phi-3's fused
        // matrices in place of the parts they hold.
        let qkv = q_dim.saturating_add(kv_dim.saturating_mul(2));
        let mut layer = vec![("attn_norm.weight", vec![hidden])];
        if fused {
            layer.push(("attn_qkv.weight", vec![qkv, hidden]));
        } else {
            layer.push(("attn_q.weight", vec![q_dim, hidden]));
            layer.push(("attn_k.weight", vec![kv_dim, hidden]));
            layer.push(("attn_v.weight", vec![kv_dim, hidden]));
        }
        layer.push(("attn_output.weight", vec![hidden, q_dim]));
        layer.push(("ffn_norm.weight", vec![hidden]));
        if fused {
            // Gate then up in one matrix.
            layer.push(("ffn_up.weight", vec![ffn.saturating_mul(2), hidden]));
        } else {
            layer.push(("ffn_gate.weight", vec![ffn, hidden]));
            layer.push(("ffn_up.weight", vec![ffn, hidden]));
        }
        layer.push(("ffn_down.weight", vec![hidden, ffn]));
        if qk_norm {
            layer.push(("attn_q_norm.weight", vec![head_dim]));
            layer.push(("attn_k_norm.weight", vec![head_dim]));
        }
        if post_norms {
            layer.push(("post_attention_norm.weight", vec![hidden]));
            layer.push(("post_ffw_norm.weight", vec![hidden]));
        }
        if config.qkv_bias {
            layer.push(("attn_q.bias", vec![q_dim]));
            layer.push(("attn_k.bias", vec![kv_dim]));
            layer.push(("attn_v.bias", vec![kv_dim]));
        }
        layer
            .into_iter()
            .map(move |(name, shape)| (format!("blk.{i}.{name}"), shape))
    });
    globals.into_iter().chain(layers)
}

/// Validates the configuration and the tensors against it.
pub(super) fn validate(checkpoint: &Checkpoint) -> Result<(), FormatError> {
    let path = &checkpoint.source;
    let config = &checkpoint.config;
    config
        .validate()
        .map_err(|reason| FormatError::InvalidConfig {
            path: path.clone(),
            reason,
        })?;
    for (name, shape) in expected_tensors(config) {
        let tensor = checkpoint
            .tensors
            .get(&name)
            .ok_or_else(|| FormatError::MissingTensor {
                path: path.clone(),
                tensor: name.clone(),
            })?;
        check_tensor(path, &name, tensor, &shape)?;
    }
    if !config.qkv_bias {
        // Bounded by the tensors present, not by the configured layer count.
        for i in 0..config.n_layers.min(checkpoint.tensors.len()) {
            for kind in ["attn_k.bias", "attn_v.bias"] {
                let name = format!("blk.{i}.{kind}");
                if checkpoint.tensors.contains_key(&name) {
                    return Err(FormatError::InvalidConfig {
                        path: path.clone(),
                        reason: format!(
                            "it holds {name} but no blk.0.attn_q.bias; Q, K and V carry biases \
                             together or not at all"
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

fn check_tensor(
    path: &Path,
    name: &str,
    tensor: &TensorData,
    expected: &[usize],
) -> Result<(), FormatError> {
    if tensor.shape != expected {
        return Err(FormatError::ShapeMismatch {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            actual: tensor.shape.clone(),
        });
    }
    // Norm weights and biases are used as f32 vectors; a float type of any
    // width converts exactly enough, block-quantized ones are not expected.
    if expected.len() == 1 && tensor.dtype.is_quantized() {
        return Err(FormatError::WrongTensorType {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            dtype: tensor.dtype.to_string(),
            reason: "vectors (norm weights, biases) must be f32, f16 or bf16".into(),
        });
    }
    let elements = expected
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or(usize::MAX);
    if tensor.dtype.bytes_for(elements) != Some(tensor.data.len()) {
        return Err(FormatError::BadTensor {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            reason: format!(
                "it holds {} bytes, which is not {elements} {} elements",
                tensor.data.len(),
                tensor.dtype
            ),
        });
    }
    Ok(())
}
