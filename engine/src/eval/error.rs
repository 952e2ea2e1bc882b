//! Why an evaluation could not run. Suite errors name the file and line.

use std::path::PathBuf;

use crate::model::ModelError;
use crate::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read the suite {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}:{line}: {reason}")]
    Item {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("the suite {path} holds no items")]
    Empty { path: PathBuf },
    #[error("item on line {line}: {reason}")]
    Encode { line: usize, reason: String },
    #[error("item on line {line} needs {tokens} tokens; the model's context window is {context}")]
    TooLong {
        line: usize,
        tokens: usize,
        context: usize,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("forward pass: {0}")]
    Model(#[from] ModelError),
}
