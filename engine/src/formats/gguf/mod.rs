//! GGUF (v2 and v3): our own reader and writer.
//!
//! A GGUF file is a little-endian header (magic, version, counts, typed
//! metadata, tensor descriptions) followed by tensor data, each tensor at an
//! offset that is a multiple of `general.alignment` from the aligned start
//! of the data section. GGUF lists dimensions innermost first (`ne[0]` is
//! contiguous); [`TensorInfo::shape`] is outermost first like the rest of
//! Switchyard.

mod config;
mod file;
mod ggml_types;
mod layer_subset;
mod metadata;
mod reader;
mod rope_freqs;
mod writer;

use switchyard_kernels::DType;

pub use config::model_config;
pub use file::GgufFile;
pub use ggml_types::ggml_type_name;
pub use layer_subset::{parse_layers, spell as spell_layers, write_layer_subset};
pub use metadata::{MetaValue, Metadata};
pub use rope_freqs::llama3_rope_divisors;
pub use writer::GgufWriter;

/// The first four bytes of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor as described in a GGUF header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Outermost first: a matrix is `[rows, cols]` (GGUF's `[ne1, ne0]`).
    pub shape: Vec<usize>,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: usize,
}
