//! LoRA adapters: many fine-tunes served over one base, mixed in one batch.
//!
//! An adapter comes as a PEFT folder (`peft`) or a llama.cpp GGUF adapter
//! (`gguf`); both load into [`AdapterWeights`] (per layer and weight, `A`
//! and `Bᵀ` in f32, Q/K rows in the base's order, scale `alpha / rank`),
//! validated against the base's configuration: a wrong base, a wrong
//! shape, a truncated file, rank 0 or an unknown target is an
//! [`AdapterError`] naming the file and tensor. [`ResidentAdapter`] is the
//! same in a backend's memory; a step adds each adapter's update to its own
//! rows after the base's products (`model::step`), and the prompt cache
//! keys blocks by [`ResidentAdapter::identity`].
//!
//! ```no_run
//! use switchyard_engine::adapter::load_adapter;
//! use switchyard_engine::formats::load_checkpoint;
//!
//! let base = load_checkpoint(std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
//! let adapter = load_adapter(std::path::Path::new("my-lora/"), &base)?;
//! println!("rank {}, {} bytes", adapter.max_rank(), adapter.bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod gguf;
mod order;
pub mod peft;
mod resident;
mod target;
mod weights;
mod write;

use std::path::Path;

pub use error::AdapterError;
pub use order::{reorder_columns, RowOrder};
pub use resident::{resident_dtype, ResidentAdapter, ResidentWeight, DTYPE_ENV_VAR, F32_ENV_VAR};
pub use target::{Target, TARGETS};
pub use weights::{AdapterFormat, AdapterWeights, LoraWeight, MAX_RANK};
pub use write::{LoraPair, LoraSet};

use crate::formats::gguf::GGUF_MAGIC;
use crate::formats::Checkpoint;

/// Loads the adapter at `path` (a PEFT folder or a GGUF adapter file) for
/// `base`, checked against the base's architecture and shapes.
pub fn load_adapter(path: &Path, base: &Checkpoint) -> Result<AdapterWeights, AdapterError> {
    let io = |source| AdapterError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        if !path.join(peft::CONFIG_FILE).is_file() {
            return Err(AdapterError::NotAnAdapter {
                path: path.to_path_buf(),
            });
        }
        return peft::load(path, base);
    }
    let mut magic = [0u8; 4];
    use std::io::Read;
    let read = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(io)?;
    if read < 4 || magic != GGUF_MAGIC {
        return Err(AdapterError::NotAnAdapter {
            path: path.to_path_buf(),
        });
    }
    gguf::load(path, base)
}
