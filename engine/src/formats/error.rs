//! Everything that can go wrong reading or writing a checkpoint.
//!
//! Every variant names the file (or folder) and says, in words a user can act
//! on, what is wrong with it.

use std::path::PathBuf;

/// An error loading, parsing, validating or writing a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {path}: {source}; check the path exists and is readable")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}; check the folder exists and there is space left")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is neither a GGUF file (it starts with \"{}\", not \"GGUF\") nor a Hugging \
         Face folder; pass a .gguf file or a folder holding config.json",
        .found.escape_ascii()
    )]
    NotACheckpoint { path: PathBuf, found: Vec<u8> },
    #[error(
        "{path} is GGUF version {version}, which Switchyard does not read (it reads v2 and v3); \
         re-convert the model with a current llama.cpp convert script"
    )]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error(
        "{path} is a big-endian GGUF file; Switchyard reads little-endian files only, convert \
         the model again without --bigendian"
    )]
    BigEndian { path: PathBuf },
    #[error(
        "{path} is truncated: {what} needs {needed} bytes at offset {offset}, but the file ends \
         at {len}; the file is probably a partial download, fetch it again"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{path} has a malformed GGUF header: {reason}; the file is corrupt, fetch it again")]
    MalformedHeader { path: PathBuf, reason: String },
    #[error(
        "{path}: tensor '{tensor}' has ggml type {type_name} (id {type_id}), which Switchyard \
         does not support; supported types are f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, \
         q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl and iq4_xs, re-quantize the model to one of them"
    )]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
        type_name: String,
    },
    #[error("{path}: tensor '{tensor}' is invalid: {reason}; the file is corrupt, fetch it again")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error(
        "{path}: tensor '{tensor}' occupies bytes {start}..{end}, past the end of the file \
         ({len} bytes); the file is truncated or corrupt, fetch it again"
    )]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("{path} holds tensor '{tensor}' twice; the file is corrupt, re-convert it")]
    DuplicateTensor { path: PathBuf, tensor: String },
    #[error(
        "{path} has no tensor '{tensor}', which the model needs; the checkpoint is incomplete \
         or is not a Llama-family model"
    )]
    MissingTensor { path: PathBuf, tensor: String },
    #[error(
        "{path}: tensor '{tensor}' has shape {actual:?}, but the model configuration implies \
         {expected:?}; the configuration and the weights do not belong together"
    )]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("{path}: tensor '{tensor}' has type {dtype}, but {reason}")]
    WrongTensorType {
        path: PathBuf,
        tensor: String,
        dtype: String,
        reason: String,
    },
    #[error("{path}: configuration '{key}' {reason}")]
    BadConfig {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error(
        "{path}: architecture '{name}' is not supported; Switchyard serves llama, mistral, \
         qwen2, qwen3, gemma2, gemma3 (text) and phi3 models: convert the model from one of \
         those families, or serve this one with another engine"
    )]
    UnsupportedArchitecture { path: PathBuf, name: String },
    #[error("{path}: the model configuration is inconsistent: {reason}")]
    InvalidConfig { path: PathBuf, reason: String },
    #[error("{path} has no tokenizer: {reason}")]
    MissingTokenizer { path: PathBuf, reason: String },
    #[error("{path} is missing {file}, which a Hugging Face checkpoint folder needs")]
    MissingFile { path: PathBuf, file: String },
    #[error("{path} is not valid JSON: {source}; fix or replace the file")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{path} is not a valid safetensors file: {reason}; the file is corrupt, fetch it again"
    )]
    Safetensors { path: PathBuf, reason: String },
    #[error(
        "{path}: tensor '{tensor}' has dtype {dtype}; Switchyard loads F32, F16 and BF16 \
         safetensors, convert the weights to one of them"
    )]
    UnsupportedSafetensorsDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("cannot write {path}: {reason}")]
    Unwritable { path: PathBuf, reason: String },
}
