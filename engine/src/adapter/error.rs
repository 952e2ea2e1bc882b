//! Why an adapter was refused. Every message names the file and, where
//! one is at fault, the tensor and the shapes: a bad adapter is refused at
//! load while the server goes on serving.

use std::path::PathBuf;

use crate::formats::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not a LoRA adapter: give a PEFT folder (adapter_config.json and \
         adapter_model.safetensors) or a llama.cpp GGUF adapter (general.type = adapter)"
    )]
    NotAnAdapter { path: PathBuf },
    /// The file could not be read as the format it claims (truncated,
    /// corrupt header, ...).
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("{path}: the adapter is for {adapter}, but the base model is {base}")]
    WrongBase {
        path: PathBuf,
        adapter: String,
        base: String,
    },
    #[error(
        "{path}: target '{target}' is not one an adapter can change here; adapters may \
         target q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj"
    )]
    UnknownTarget { path: PathBuf, target: String },
    #[error("{path}: tensor {tensor} has shape {shape:?}, but the base model needs {expected}")]
    BadShape {
        path: PathBuf,
        tensor: String,
        shape: Vec<usize>,
        expected: String,
    },
    #[error("{path}: tensor {tensor} has rank 0; a LoRA rank must be at least 1")]
    RankZero { path: PathBuf, tensor: String },
    #[error("{path}: tensor {tensor} has rank {rank}; Switchyard takes ranks up to {max}")]
    RankTooLarge {
        path: PathBuf,
        tensor: String,
        rank: usize,
        max: usize,
    },
    #[error("{path}: {tensor} has no partner {missing}")]
    MissingPair {
        path: PathBuf,
        tensor: String,
        missing: String,
    },
    #[error("{path}: tensor {tensor} is {dtype}; adapter tensors may be F32, F16, BF16 or Q8_0")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: tensor {tensor}: {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: the adapter holds no LoRA tensors")]
    Empty { path: PathBuf },
}
