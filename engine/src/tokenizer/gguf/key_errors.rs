//! The errors of a GGUF tokenizer key that is missing, of the wrong type or unusable,
//! shared by the vocabulary readers (`gguf.rs`, `spm.rs`).

use std::path::Path;

use super::TokenizerError;
use crate::formats::gguf::Metadata;

pub(super) fn missing_or_bad(
    file: &Path,
    metadata: &Metadata,
    key: &str,
    expected: &str,
) -> TokenizerError {
    match metadata.get(key) {
        None => TokenizerError::MissingKey {
            file: file.to_path_buf(),
            key: key.to_string(),
        },
        Some(value) => bad_key(
            file,
            key,
            format!("expected {expected}, found {}", value.type_name()),
        ),
    }
}

pub(super) fn bad_key(file: &Path, key: &str, reason: String) -> TokenizerError {
    TokenizerError::BadKey {
        file: file.to_path_buf(),
        key: key.to_string(),
        reason,
    }
}

pub(super) fn build_error(file: &Path, e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build {
        file: file.to_path_buf(),
        reason: e.to_string(),
    }
}
