//! Small deterministic checkpoints for tests, written as GGUF or safetensors.
//!
//! A [`SyntheticSpec`] (preset, tensor type, seed) fixes a model completely:
//! the same spec always gives the same bytes, and the same preset and seed
//! give the same model in every format and type (up to quantization), with
//! a small real byte-level BPE tokenizer and a ChatML chat template.
//!
//! ```no_run
//! use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
//! use switchyard_kernels::DType;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let spec = SyntheticSpec { preset: Preset::Llama, dtype: DType::Q4K, seed: 7 };
//! write_gguf(&spec, std::path::Path::new("/tmp/llama-q4k.gguf"))?;
//! # Ok(())
//! # }
//! ```

mod bpe;
mod gguf;
mod hf;
mod presets;
mod weights;

use switchyard_kernels::DType;

pub use bpe::{byte_to_unicode, SyntheticVocab, CHATML_TEMPLATE, SPECIAL_TOKENS};
pub use gguf::write_gguf;
pub use hf::{tokenizer_json, write_safetensors};
pub use presets::Preset;
pub use weights::{permute_for_interleaved_rope, synthetic_tensors, SyntheticTensor};

/// Everything that determines a synthetic checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticSpec {
    pub preset: Preset,
    /// The type of the weight matrices (token embedding included). GGUF
    /// keeps norm weights and biases in f32; safetensors uses this type for
    /// every tensor and accepts only f32, f16 and bf16.
    pub dtype: DType,
    pub seed: u64,
}

/// The id of `<|endoftext|>`, the synthetic models' BOS and padding token.
pub fn bos_token_id(vocab: &SyntheticVocab) -> u32 {
    vocab.special_id(SPECIAL_TOKENS[0]).unwrap_or(0)
}

/// The id of `<|im_end|>`, the synthetic models' EOS token.
pub fn eos_token_id(vocab: &SyntheticVocab) -> u32 {
    vocab.special_id(SPECIAL_TOKENS[2]).unwrap_or(0)
}
