//! What making the demo repository reports: progress events and errors.

use std::path::{Path, PathBuf};

use switchyard_kernels::KernelError;

use crate::formats::FormatError;

/// Progress of `make_demo_repository`, for log lines and progress bars.
#[derive(Clone, Copy, Debug)]
pub enum DemoEvent<'a> {
    /// A checkpoint is about to be made; `tensors` is how many
    /// [`DemoEvent::Tensor`] events follow (0 for a link or copy).
    Started {
        label: &'a str,
        path: &'a Path,
        tensors: usize,
    },
    /// One tensor of the checkpoint `label` is done.
    Tensor { label: &'a str, name: &'a str },
    /// The checkpoint is on disk; `how` says how it got there.
    Finished {
        label: &'a str,
        path: &'a Path,
        bytes: u64,
        how: &'a str,
    },
}

/// An error making the demo repository.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot make a demo from the base checkpoint: {0}")]
    Base(#[source] FormatError),
    #[error("{path} is a Hugging Face folder; the demo repository is made from a GGUF file, pass one with --base")]
    BaseNotGguf { path: PathBuf },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot write {path}: {source}; check the folder is writable and has space left")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot re-encode tensor '{tensor}' of {base}: {source}")]
    Tensor {
        base: PathBuf,
        tensor: String,
        source: KernelError,
    },
}
