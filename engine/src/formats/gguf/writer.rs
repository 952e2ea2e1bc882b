//! Writing GGUF v3 files: metadata of every type and aligned tensor data.

use std::io::{Read as _, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use switchyard_kernels::DType;

use super::metadata::MetaValue;
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::formats::FormatError;

/// Builds a GGUF v3 file in memory and writes it out.
///
/// ```
/// use switchyard_engine::formats::gguf::{GgufFile, GgufWriter, MetaValue};
/// use switchyard_kernels::DType;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut w = GgufWriter::new("tiny.gguf");
/// w.add_metadata("general.architecture", MetaValue::String("llama".into()));
/// let ones: Vec<u8> = [1.0f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
/// w.add_tensor("ones", DType::F32, &[2, 2], ones.into())?;
/// let file = GgufFile::parse(&w.to_bytes()?)?;
/// assert_eq!(file.tensors()["ones"].shape, vec![2, 2]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct GgufWriter {
    path: PathBuf,
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug)]
struct PendingTensor {
    name: String,
    dtype: DType,
    /// Outermost first.
    shape: Vec<usize>,
    data: Bytes,
}

impl GgufWriter {
    /// A writer whose [`GgufWriter::write`] goes to `path` (also named in errors).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets `general.alignment` (a power of two; 32 when not set).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), FormatError> {
        if !alignment.is_power_of_two() {
            return Err(self.unwritable(format!("alignment {alignment} is not a power of two")));
        }
        self.alignment = u64::from(alignment);
        self.add_metadata("general.alignment", MetaValue::U32(alignment));
        Ok(())
    }

    /// Adds (or replaces) a metadata entry. Entries are written in the order
    /// they were first added.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: MetaValue) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Adds a tensor. `shape` is outermost first (`[rows, cols]`); `data`
    /// must hold exactly that many elements of `dtype`.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[usize],
        data: Bytes,
    ) -> Result<(), FormatError> {
        let name = name.into();
        if shape.is_empty() || shape.len() > 4 || shape.contains(&0) {
            return Err(self.unwritable(format!(
                "tensor '{name}' has shape {shape:?}; GGUF needs 1 to 4 non-zero dimensions"
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(self.unwritable(format!("tensor '{name}' is added twice")));
        }
        let cols = shape.last().copied().unwrap_or(1);
        let expected = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|_| cols % dtype.block_len() == 0)
            .and_then(|n| dtype.bytes_for(n));
        if expected != Some(data.len()) {
            return Err(self.unwritable(format!(
                "tensor '{name}' of shape {shape:?} and type {dtype} needs {expected:?} bytes \
                 (rows of whole {}-element blocks) but {} were given",
                dtype.block_len(),
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            dtype,
            shape: shape.to_vec(),
            data,
        });
        Ok(())
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .map_err(|source| FormatError::Write {
                path: self.path.clone(),
                source,
            })?;
        Ok(out)
    }

    /// Writes the file to the path given to [`GgufWriter::new`].
    pub fn write(&self) -> Result<(), FormatError> {
        let werr = |source| FormatError::Write {
            path: self.path.clone(),
            source,
        };
        let file = std::fs::File::create(&self.path).map_err(werr)?;
        let mut out = std::io::BufWriter::new(file);
        self.write_to(&mut out).map_err(werr)?;
        out.flush().map_err(werr)
    }

    /// The destination path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the file to `out`.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut header, key);
            header.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut header, value)?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&t.dtype.ggml_id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        pad_to(&mut header, self.alignment);
        out.write_all(&header)?;
        let mut written = 0u64;
        for (t, &start) in self.tensors.iter().zip(&offsets) {
            write_zeros(out, start - written)?;
            out.write_all(&t.data)?;
            written = start + t.data.len() as u64;
        }
        write_zeros(out, offset.saturating_sub(written))
    }

    fn unwritable(&self, reason: String) -> FormatError {
        FormatError::Unwritable {
            path: self.path.clone(),
            reason,
        }
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = out.len() as u64;
    out.resize(len.next_multiple_of(alignment) as usize, 0);
}

fn write_zeros(out: &mut impl Write, n: u64) -> std::io::Result<()> {
    std::io::copy(&mut std::io::repeat(0).take(n), out).map(|_| ())
}

/// The GGUF value type id of a metadata value.
fn type_id(value: &MetaValue) -> u32 {
    match value {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) -> std::io::Result<()> {
    match value {
        MetaValue::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Array(items) => {
            // GGUF arrays are homogeneous; an empty one gets an arbitrary type.
            let element_type = items.first().map_or(0, type_id);
            if items.iter().any(|v| type_id(v) != element_type) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a GGUF metadata array must hold values of one type",
                ));
            }
            out.extend_from_slice(&element_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item)?;
            }
        }
    }
    Ok(())
}
