//! Hugging Face checkpoint folders: `config.json`, `tokenizer.json` and
//! `model.safetensors` (or shards listed in `model.safetensors.index.json`),
//! memory-mapped and handed out zero-copy under GGUF tensor names.

mod config;
mod names;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use switchyard_kernels::DType;

use super::{Checkpoint, CheckpointFormat, FormatError, TensorData, TokenizerSource};
use crate::model::config::Architecture;
pub use names::{gguf_name, hf_name};

/// The single-file weights name.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Loads a Hugging Face folder (not yet validated against the config).
pub(super) fn load_folder(dir: &Path) -> Result<Checkpoint, FormatError> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(FormatError::MissingFile {
            path: dir.to_path_buf(),
            file: "config.json".into(),
        });
    }
    let config_text = read_text(&config_path)?;
    let tokenizer_json = dir.join("tokenizer.json");
    if !tokenizer_json.is_file() {
        return Err(FormatError::MissingTokenizer {
            path: dir.to_path_buf(),
            reason: "tokenizer.json is missing; copy it from the model's repository".into(),
        });
    }
    let tokenizer_config = Some(dir.join("tokenizer_config.json")).filter(|p| p.is_file());

    // Tensor names depend on the family (see `names`).
    let arch = config::architecture(&config_text, &config_path)?;
    let mut tensors = BTreeMap::new();
    for file in weight_files(dir)? {
        read_shard(&file, arch, &mut tensors)?;
    }
    let config = config::parse_config(
        &config_text,
        &config_path,
        tensors.contains_key("blk.0.attn_q.bias"),
    )?;
    Ok(Checkpoint {
        source: dir.to_path_buf(),
        format: CheckpointFormat::Safetensors,
        config,
        tensors,
        tokenizer: TokenizerSource::HuggingFace {
            tokenizer_json,
            tokenizer_config,
        },
    })
}

fn read_text(path: &Path) -> Result<String, FormatError> {
    std::fs::read_to_string(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// The safetensors files of the folder: the shards named by the index, or
/// the single weights file.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, FormatError> {
    let index_path = dir.join(INDEX_FILE);
    if !index_path.is_file() {
        let single = dir.join(WEIGHTS_FILE);
        if !single.is_file() {
            return Err(FormatError::MissingFile {
                path: dir.to_path_buf(),
                file: format!("{WEIGHTS_FILE} (or {INDEX_FILE} with its shards)"),
            });
        }
        return Ok(vec![single]);
    }
    let index: ShardIndex =
        serde_json::from_str(&read_text(&index_path)?).map_err(|source| FormatError::Json {
            path: index_path.clone(),
            source,
        })?;
    let names: BTreeSet<&String> = index.weight_map.values().collect();
    names
        .into_iter()
        .map(|name| {
            // Shards live beside the index; a path elsewhere is refused.
            let plain = Path::new(name)
                .file_name()
                .is_some_and(|f| f == name.as_str());
            if !plain {
                return Err(FormatError::BadConfig {
                    path: index_path.clone(),
                    key: "weight_map".into(),
                    reason: format!("names shard '{name}', which is not a plain file name"),
                });
            }
            let file = dir.join(name);
            if !file.is_file() {
                return Err(FormatError::MissingFile {
                    path: dir.to_path_buf(),
                    file: format!("{name} (listed in {INDEX_FILE})"),
                });
            }
            Ok(file)
        })
        .collect()
}

/// Maps one safetensors file and adds its tensors, renamed, to `tensors`.
fn read_shard(
    path: &Path,
    arch: Architecture,
    tensors: &mut BTreeMap<String, TensorData>,
) -> Result<(), FormatError> {
    let io_err = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    // SAFETY: read-only map; the checkpoint must not change while served.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
    shard_tensors(Bytes::from_owner(map), path, arch, tensors)
}

/// Adds the tensors of one safetensors file, held in `bytes` (read from `path`, which
/// errors name), renamed as `arch` names them, to `tensors`: header, dtypes, offsets
/// and names checked.
pub fn shard_tensors(
    bytes: Bytes,
    path: &Path,
    arch: Architecture,
    tensors: &mut BTreeMap<String, TensorData>,
) -> Result<(), FormatError> {
    let (header_len, metadata) =
        SafeTensors::read_metadata(&bytes).map_err(|e| FormatError::Safetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    // read_metadata checked that the offsets tile the data exactly.
    let data_start = 8usize.saturating_add(header_len);
    for (hf_name, info) in metadata.tensors() {
        let dtype = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                return Err(FormatError::UnsupportedSafetensorsDtype {
                    path: path.to_path_buf(),
                    tensor: hf_name,
                    dtype: format!("{other:?}"),
                })
            }
        };
        let (start, end) = info.data_offsets;
        let range = data_start
            .checked_add(start)
            .zip(data_start.checked_add(end));
        let data = match range {
            Some((s, e)) if s <= e && e <= bytes.len() => bytes.slice(s..e),
            _ => {
                return Err(FormatError::TensorOutOfBounds {
                    path: path.to_path_buf(),
                    tensor: hf_name,
                    start: start as u64,
                    end: end as u64,
                    len: bytes.len() as u64,
                })
            }
        };
        let name = gguf_name(&hf_name, arch).unwrap_or_else(|| hf_name.clone());
        let tensor = TensorData {
            dtype,
            shape: info.shape.clone(),
            data,
        };
        if tensors.insert(name, tensor).is_some() {
            return Err(FormatError::DuplicateTensor {
                path: path.to_path_buf(),
                tensor: hf_name,
            });
        }
    }
    Ok(())
}
