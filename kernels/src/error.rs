//! Errors a kernel call can return.

use crate::DType;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("a {dtype} row of {cols} elements is not a whole number of {block}-element blocks")]
    RaggedRow {
        dtype: DType,
        cols: usize,
        block: usize,
    },
    #[error("a {dtype} tensor of {rows}×{cols} needs {expected} bytes but {actual} were given")]
    WrongByteLength {
        dtype: DType,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("KV cache holds {capacity} positions; position {position} does not fit")]
    KvCacheFull { capacity: usize, position: usize },
    /// The OS refused memory for a KV block (the host has less than the
    /// budget assumed).
    #[error("could not allocate a KV block of {bytes} bytes")]
    KvAlloc { bytes: usize },
    /// The backend lacks an operation (LoRA adapters on a backend that
    /// has no kernel for them yet).
    #[error("the {backend} backend has no {op} kernel")]
    Unsupported { op: &'static str, backend: String },
    /// A device backend's call failed (a driver error, device memory
    /// exhausted): the message names the call.
    #[error("device: {0}")]
    Device(String),
    /// A step replayed from a recording (a CUDA graph) differed from the
    /// recorded one before anything was launched: the step must run again
    /// unrecorded (`Backend::begin_step` with no key).
    #[error("the replayed step differs from its recording: {0}")]
    StepDiverged(String),
}
