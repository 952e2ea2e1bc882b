//! Everything that can go wrong while loading a tokenizer or using it.

use std::path::PathBuf;

/// A tokenizer failure; each variant names the file, key or id at fault.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "cannot read tokenizer file {path}: {source}; check that the file exists and is readable"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{path} is not a valid tokenizer.json: {reason}")]
    InvalidTokenizerJson { path: PathBuf, reason: String },

    #[error("{path} is not a valid tokenizer_config.json: {reason}")]
    InvalidTokenizerConfig { path: PathBuf, reason: String },

    #[error("{file}: GGUF metadata key `{key}` is missing; the file has no usable tokenizer (re-convert it with a current llama.cpp)")]
    MissingKey { file: PathBuf, key: String },

    #[error("{file}: GGUF metadata key `{key}` is malformed: {reason}")]
    BadKey {
        file: PathBuf,
        key: String,
        reason: String,
    },

    #[error("{file}: tokenizer model `{model}` is not supported (supported: `gpt2` byte-level BPE, `llama` SentencePiece BPE)")]
    UnsupportedModel { file: PathBuf, model: String },

    #[error("{file}: pre-tokenizer `{pre}` (tokenizer.ggml.pre) is not supported (supported: {supported})")]
    UnsupportedPreTokenizer {
        file: PathBuf,
        pre: String,
        supported: String,
    },

    #[error("{file}: building the tokenizer failed: {reason}")]
    Build { file: PathBuf, reason: String },

    #[error("encoding text failed: {reason}")]
    Encode { reason: String },

    #[error("decoding token ids failed: {reason}")]
    Decode { reason: String },

    #[error("token id {id} is outside the vocabulary ({vocab_size} tokens)")]
    IdOutOfRange { id: u32, vocab_size: usize },
}
