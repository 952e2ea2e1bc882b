//! Errors from building or running a model.

use std::path::PathBuf;

use switchyard_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: tensor `{tensor}` is missing; the checkpoint is incomplete", file.display())]
    MissingTensor { file: PathBuf, tensor: String },
    #[error("{}: tensor `{tensor}` should be {expected} but has shape {shape:?}", file.display())]
    BadShape {
        file: PathBuf,
        tensor: String,
        expected: &'static str,
        shape: Vec<usize>,
    },
    #[error("{}: tensor `{tensor}`: {source}", file.display())]
    Tensor {
        file: PathBuf,
        tensor: String,
        source: KernelError,
    },
    #[error("token id {token} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("position {position} is past the model's context window of {context_length} tokens")]
    ContextExceeded {
        position: usize,
        context_length: usize,
    },
    #[error("a forward step needs at least one token")]
    EmptyBatch,
    #[error(
        "one step cannot run checkpoints of different architectures or shapes \
         ({first} and {other}); run them in separate steps"
    )]
    MixedArchitectures { first: String, other: String },
    #[error("a checkpoint in the step has no layer {index} although its configuration does")]
    MissingLayer { index: usize },
    #[error(
        "the embedding's hidden states are all zero or not finite; the checkpoint's weights \
         may be corrupt"
    )]
    DegenerateEmbedding,
    #[error("kernel failed: {0}")]
    Kernel(#[from] KernelError),
}
