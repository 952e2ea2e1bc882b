//! An opened GGUF file: its parsed header over the file's bytes, handing
//! out tensor data zero-copy.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::metadata::Metadata;
use super::reader::parse_header;
use super::TensorInfo;
use crate::formats::{FormatError, TensorData};

/// A parsed GGUF file (v2 or v3). Tensor data stays in the memory map (or
/// the buffer it was parsed from) and is shared, never copied.
#[derive(Clone, Debug)]
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Arc<Metadata>,
    tensors: BTreeMap<String, TensorInfo>,
    data_start: u64,
    alignment: u64,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref();
        let io_err = |source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely
        // on nobody truncating or rewriting the checkpoint while it is served.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::from_bytes(Bytes::from_owner(map), path)
    }

    /// Parses a GGUF image held in memory (copied once), named `<memory>` in
    /// errors. This is the fuzzing entry point.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        Self::from_bytes(Bytes::copy_from_slice(bytes), Path::new("<memory>"))
    }

    /// Parses a GGUF image; tensor data is sliced from `bytes` without
    /// copying, and `path` names the source in errors.
    pub fn from_bytes(bytes: Bytes, path: &Path) -> Result<Self, FormatError> {
        let header = parse_header(&bytes, path)?;
        let tensors = header
            .tensors
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            version: header.version,
            metadata: Arc::new(header.metadata),
            tensors,
            data_start: header.data_start,
            alignment: header.alignment,
        })
    }

    /// Where the file was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The metadata, shared (for a tokenizer built later from it).
    pub fn metadata_arc(&self) -> Arc<Metadata> {
        Arc::clone(&self.metadata)
    }

    /// Every tensor's description, by name.
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// One tensor's bytes, zero-copy.
    pub fn tensor_data(&self, name: &str) -> Result<TensorData, FormatError> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
            })?;
        let out_of_bounds = || FormatError::TensorOutOfBounds {
            path: self.path.clone(),
            tensor: name.to_string(),
            start: self.data_start.saturating_add(info.offset),
            end: self
                .data_start
                .saturating_add(info.offset)
                .saturating_add(info.size as u64),
            len: self.bytes.len() as u64,
        };
        // The header parser already checked these bounds; checking again
        // keeps this function panic-free on its own.
        let start = usize::try_from(self.data_start.saturating_add(info.offset))
            .map_err(|_| out_of_bounds())?;
        let end = start.checked_add(info.size).ok_or_else(out_of_bounds)?;
        if end > self.bytes.len() {
            return Err(out_of_bounds());
        }
        Ok(TensorData {
            dtype: info.dtype,
            shape: info.shape.clone(),
            data: self.bytes.slice(start..end),
        })
    }

    /// Every tensor's data, by name.
    pub fn all_tensor_data(&self) -> Result<BTreeMap<String, TensorData>, FormatError> {
        self.tensors
            .keys()
            .map(|name| Ok((name.clone(), self.tensor_data(name)?)))
            .collect()
    }
}
