//! [`load_checkpoint`]: one entry point for GGUF files and Hugging Face folders.

use std::io::Read;
use std::path::Path;

use super::gguf::{model_config, GgufFile, GGUF_MAGIC};
use super::{safetensors, validate, Checkpoint, CheckpointFormat, FormatError, TokenizerSource};

/// Loads and validates a checkpoint: a GGUF file (recognised by its magic
/// bytes) or a Hugging Face folder (`config.json`, `tokenizer.json`,
/// safetensors weights). Tensor data stays memory-mapped.
///
/// The result has a consistent configuration, every tensor the Llama forward
/// pass needs with the shape the configuration implies, and a tokenizer.
pub fn load_checkpoint(path: &Path) -> Result<Checkpoint, FormatError> {
    let metadata = std::fs::metadata(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let checkpoint = if metadata.is_dir() {
        safetensors::load_folder(path)?
    } else {
        let magic = read_magic(path)?;
        if magic != GGUF_MAGIC {
            return Err(FormatError::NotACheckpoint {
                path: path.to_path_buf(),
                found: magic,
            });
        }
        load_gguf(path)?
    };
    validate::validate(&checkpoint)?;
    Ok(checkpoint)
}

/// The first (up to) four bytes of a file.
fn read_magic(path: &Path) -> Result<Vec<u8>, FormatError> {
    let io_err = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut magic = Vec::with_capacity(4);
    std::fs::File::open(path)
        .map_err(io_err)?
        .take(4)
        .read_to_end(&mut magic)
        .map_err(io_err)?;
    Ok(magic)
}

fn load_gguf(path: &Path) -> Result<Checkpoint, FormatError> {
    let file = GgufFile::open(path)?;
    let config = model_config(&file)?;
    if file.metadata().get_str("tokenizer.ggml.model").is_none() {
        return Err(FormatError::MissingTokenizer {
            path: path.to_path_buf(),
            reason: "its metadata has no tokenizer.ggml.model; re-convert the model with its \
                     tokenizer"
                .into(),
        });
    }
    Ok(Checkpoint {
        source: path.to_path_buf(),
        format: CheckpointFormat::Gguf,
        config,
        tensors: file.all_tensor_data()?,
        tokenizer: TokenizerSource::Gguf {
            file: path.to_path_buf(),
            metadata: file.metadata_arc(),
        },
    })
}
