//! Hugging Face tensor names → GGUF tensor names.
//!
//! One table serves every family but Gemma's norms: a Llama block's
//! `post_attention_layernorm` is the MLP's input norm (`ffn_norm`), while
//! Gemma has a norm after attention under that name and calls the MLP's
//! input norm `pre_feedforward_layernorm`.

use crate::model::config::Architecture;

/// Module names where Gemma differs from the shared table.
const GEMMA_NORMS: [(&str, &str); 3] = [
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// Hugging Face module → GGUF module, for every family but Gemma's norms.
const MODULES: [(&str, &str); 13] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("self_attn.qkv_proj", "attn_qkv"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    // Phi-3's fused gate and up (llama.cpp stores it as `ffn_up`).
    ("mlp.gate_up_proj", "ffn_up"),
];

fn modules(arch: Architecture) -> impl Iterator<Item = (&'static str, &'static str)> {
    let gemma = arch.is_gemma();
    let phi3 = arch == Architecture::Phi3;
    let shared = MODULES.into_iter().filter(move |(hf, _)| {
        let gemma_norm = *hf == "post_attention_layernorm";
        let fused_up = *hf == "mlp.gate_up_proj";
        let plain_up = *hf == "mlp.up_proj";
        let skip = (gemma && gemma_norm) || (phi3 && plain_up) || (!phi3 && fused_up);
        !skip
    });
    let extra: &'static [(&'static str, &'static str)] = if gemma { &GEMMA_NORMS } else { &[] };
    extra.iter().copied().chain(shared)
}

/// The GGUF name of a Hugging Face tensor of `arch`, or `None` for a
/// name outside the transformer block (kept under its own name by the loader).
pub fn gguf_name(hf: &str, arch: Architecture) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let (_, gguf) = modules(arch).find(|(h, _)| *h == module)?;
    Some(format!("blk.{layer}.{gguf}.{kind}"))
}

/// The Hugging Face name of a GGUF tensor of `arch` (the inverse of
/// [`gguf_name`]), used when writing safetensors.
pub fn hf_name(gguf: &str, arch: Architecture) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let (hf, _) = modules(arch).find(|(_, g)| *g == module)?;
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_both_ways() {
        let pairs = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"),
            (
                "model.layers.0.self_attn.o_proj.weight",
                "blk.0.attn_output.weight",
            ),
            (
                "model.layers.12.post_attention_layernorm.weight",
                "blk.12.ffn_norm.weight",
            ),
            (
                "model.layers.1.mlp.down_proj.weight",
                "blk.1.ffn_down.weight",
            ),
        ];
        let llama = Architecture::Llama;
        for (hf, gguf) in pairs {
            assert_eq!(gguf_name(hf, llama).as_deref(), Some(gguf));
            assert_eq!(hf_name(gguf, llama).as_deref(), Some(hf));
        }
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight", llama), None);
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq", llama),
            None
        );
    }

    #[test]
    fn gemma_norms_and_phi3_fused_tensors_map_both_ways() {
        let gemma = [
            (
                "model.layers.2.post_attention_layernorm.weight",
                "blk.2.post_attention_norm.weight",
            ),
            (
                "model.layers.2.pre_feedforward_layernorm.weight",
                "blk.2.ffn_norm.weight",
            ),
            (
                "model.layers.2.post_feedforward_layernorm.weight",
                "blk.2.post_ffw_norm.weight",
            ),
            (
                "model.layers.2.self_attn.q_norm.weight",
                "blk.2.attn_q_norm.weight",
            ),
            ("model.layers.2.mlp.up_proj.weight", "blk.2.ffn_up.weight"),
        ];
        for (hf, gguf) in gemma {
            assert_eq!(gguf_name(hf, Architecture::Gemma3).as_deref(), Some(gguf));
            assert_eq!(hf_name(gguf, Architecture::Gemma3).as_deref(), Some(hf));
        }
        let phi3 = [
            (
                "model.layers.0.self_attn.qkv_proj.weight",
                "blk.0.attn_qkv.weight",
            ),
            (
                "model.layers.0.mlp.gate_up_proj.weight",
                "blk.0.ffn_up.weight",
            ),
        ];
        for (hf, gguf) in phi3 {
            assert_eq!(gguf_name(hf, Architecture::Phi3).as_deref(), Some(gguf));
            assert_eq!(hf_name(gguf, Architecture::Phi3).as_deref(), Some(hf));
        }
    }
}
