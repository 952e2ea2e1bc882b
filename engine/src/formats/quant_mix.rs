//! A checkpoint's quant mix as people name it: the preset the file says it
//! was made with (GGUF `general.file_type`, llama.cpp's `llama_ftype`), then
//! how many weight matrices each tensor type holds, most first:
//! `Q4_K_M: Q5_0 81, Q4_K 27, Q8_0 10, Q6_K 9`. Vectors (norms, biases)
//! are left out: they are f32 in every mix.

use std::collections::BTreeMap;

use super::{Checkpoint, TokenizerSource};

/// llama.cpp's name for a `general.file_type` value.
pub fn file_type_name(file_type: u64) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        21 => "Q2_K_S",
        25 => "IQ4_NL",
        30 => "IQ4_XS",
        32 => "BF16",
        _ => return None,
    })
}

/// The mix of `checkpoint` (see the module documentation). Without a
/// named preset the label is the type most matrices hold.
pub fn quant_mix(checkpoint: &Checkpoint) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in checkpoint.tensors.values().filter(|t| t.shape.len() >= 2) {
        *counts
            .entry(t.dtype.to_string().to_uppercase())
            .or_default() += 1;
    }
    let mut by_count: Vec<(String, usize)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let preset = match &checkpoint.tokenizer {
        TokenizerSource::Gguf { metadata, .. } => metadata
            .get_u64("general.file_type")
            .and_then(file_type_name)
            .map(str::to_string),
        TokenizerSource::HuggingFace { .. } => None,
    };
    let label = preset
        .or_else(|| by_count.first().map(|(t, _)| t.clone()))
        .unwrap_or_else(|| "-".into());
    let parts: Vec<String> = by_count.iter().map(|(t, n)| format!("{t} {n}")).collect();
    format!("{label}: {}", parts.join(", "))
}
