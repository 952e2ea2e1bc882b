//! Checkpoint formats: GGUF files and Hugging Face safetensors folders,
//! loaded zero-copy over a memory map into one [`Checkpoint`] shape.
//!
//! Tensor names are normalised to GGUF's (`token_embd.weight`,
//! `blk.0.attn_q.weight`, ...), shapes are outermost-first (`[rows, cols]`,
//! `cols` contiguous), whatever the source.
//!
//! ```no_run
//! use switchyard_engine::formats::load_checkpoint;
//!
//! // A .gguf file or a Hugging Face folder; errors name the file and the fix.
//! let ckpt = load_checkpoint(std::path::Path::new("model.gguf"))?;
//! println!("{} layers, vocab {}", ckpt.config.n_layers, ckpt.config.vocab_size);
//! let embeddings = &ckpt.tensors["token_embd.weight"]; // [vocab, hidden]
//! # Ok::<(), switchyard_engine::formats::FormatError>(())
//! ```

mod error;
pub mod gguf;
mod load;
mod quant_mix;
pub mod safetensors;
mod validate;

pub use error::FormatError;
pub use load::load_checkpoint;
pub use quant_mix::{file_type_name, quant_mix};
pub use validate::expected_tensors;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use switchyard_kernels::DType;

use crate::model::config::ModelConfig;
use gguf::Metadata;

/// One tensor's bytes, zero-copy over the checkpoint file where possible.
#[derive(Clone, Debug)]
pub struct TensorData {
    pub dtype: DType,
    /// Outermost first: a matrix is `[rows, cols]`.
    pub shape: Vec<usize>,
    pub data: Bytes,
}

/// Which file layout a checkpoint came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFormat {
    Gguf,
    Safetensors,
}

/// Where the tokenizer of a checkpoint comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// Hugging Face layout: `tokenizer.json`, and `tokenizer_config.json`
    /// (special tokens, chat template) when present.
    HuggingFace {
        tokenizer_json: PathBuf,
        tokenizer_config: Option<PathBuf>,
    },
    /// GGUF `tokenizer.ggml.*` and `tokenizer.chat_template` metadata.
    Gguf {
        file: PathBuf,
        metadata: Arc<Metadata>,
    },
}

/// A loaded checkpoint: configuration, tensors and where its tokenizer is.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The file or folder it was loaded from.
    pub source: PathBuf,
    pub format: CheckpointFormat,
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, TensorData>,
    pub tokenizer: TokenizerSource,
}
