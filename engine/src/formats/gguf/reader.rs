//! Parsing a GGUF header (v2, v3, little-endian) from bytes.
//!
//! The input is untrusted: every count and length is checked against the
//! bytes that remain *before* anything is allocated for it, sizes are
//! computed with checked arithmetic, and nesting is bounded, so a hostile
//! header can neither panic the parser nor make it allocate much more than
//! the file itself.

use std::collections::HashSet;
use std::path::Path;

use switchyard_kernels::DType;

use super::ggml_types::ggml_type_name;
use super::metadata::{MetaValue, Metadata};
use super::{TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::formats::FormatError;

/// Arrays nested deeper than this are rejected (real files nest at most 2).
const MAX_ARRAY_DEPTH: usize = 8;
/// Metadata array elements over the whole file; real vocabularies hold well
/// under a million tokens and merges, so this only stops hostile files.
const MAX_METADATA_ELEMENTS: u64 = 16 << 20;
/// Tensors per file; real models have a few thousand at most.
const MAX_TENSORS: u64 = 1 << 20;
/// GGUF allows at most 4 dimensions per tensor.
const MAX_DIMS: u32 = 4;

/// The parsed header of a GGUF file.
#[derive(Debug)]
pub(super) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset where tensor data begins.
    pub data_start: u64,
    pub alignment: u64,
}

/// A bounds-checked little-endian reader over the header bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata array elements still allowed (see [`MAX_METADATA_ELEMENTS`]).
    element_budget: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn truncated(&self, what: &str, needed: u64) -> FormatError {
        FormatError::Truncated {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            offset: self.pos as u64,
            needed,
            len: self.buf.len() as u64,
        }
    }

    fn malformed(&self, reason: String) -> FormatError {
        FormatError::MalformedHeader {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| self.truncated(what, n as u64))?;
        let bytes = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| self.truncated(what, n as u64))?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in what
    /// remains, before anything is allocated for them.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<usize, FormatError> {
        let needed = count.saturating_mul(min_bytes);
        if needed > self.remaining() as u64 {
            return Err(self.truncated(&format!("{what} ({count} of them)"), needed));
        }
        usize::try_from(count).map_err(|_| self.truncated(what, needed))
    }

    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, what)?;
        let start = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.malformed(format!("{what} at offset {start} is not valid UTF-8")))
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<MetaValue, FormatError> {
        Ok(match type_id {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(key)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(key)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match u8::from_le_bytes(self.array(key)?) {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => {
                    return Err(self.malformed(format!(
                        "metadata '{key}' is a bool holding {other}, not 0 or 1"
                    )))
                }
            },
            8 => MetaValue::String(self.string(key)?),
            9 => self.array_value(key, depth)?,
            10 => MetaValue::U64(u64::from_le_bytes(self.array(key)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => {
                return Err(self.malformed(format!(
                    "metadata '{key}' has value type {other}; GGUF defines types 0 to 12"
                )))
            }
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<MetaValue, FormatError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.malformed(format!(
                "metadata '{key}' nests arrays more than {MAX_ARRAY_DEPTH} deep"
            )));
        }
        let element_type = self.u32(key)?;
        let len = self.u64(key)?;
        let min_bytes = match element_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => {
                return Err(self.malformed(format!(
                    "metadata array '{key}' has element type {other}; GGUF defines types 0 to 12"
                )))
            }
        };
        let count = self.check_count(len, min_bytes, &format!("elements of array '{key}'"))?;
        if len > self.element_budget {
            return Err(self.malformed(format!(
                "metadata arrays hold more than {MAX_METADATA_ELEMENTS} elements in all"
            )));
        }
        self.element_budget -= len;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(self.value(element_type, key, depth + 1)?);
        }
        Ok(MetaValue::Array(items))
    }
}

/// Parses the header of a GGUF file held in `buf`; `path` names it in errors.
pub(super) fn parse_header(buf: &[u8], path: &Path) -> Result<Header, FormatError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        path,
        element_budget: MAX_METADATA_ELEMENTS,
    };
    let magic: [u8; 4] = c.array("the GGUF magic")?;
    if magic != GGUF_MAGIC {
        return Err(FormatError::NotACheckpoint {
            path: path.to_path_buf(),
            found: magic.to_vec(),
        });
    }
    let version = c.u32("the GGUF version")?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(FormatError::BigEndian {
                path: path.to_path_buf(),
            })
        }
        v => {
            return Err(FormatError::UnsupportedVersion {
                path: path.to_path_buf(),
                version: v,
            })
        }
    }
    let tensor_count = c.u64("the tensor count")?;
    let kv_count = c.u64("the metadata count")?;
    // Smallest entry: empty key (8) + type (4) + one-byte value.
    let kv_count = c.check_count(kv_count, 13, "metadata entries")?;
    let mut metadata = Metadata::default();
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        let type_id = c.u32(&key)?;
        let value = c.value(type_id, &key, 0)?;
        if metadata.entries.insert(key.clone(), value).is_some() {
            return Err(c.malformed(format!("metadata key '{key}' appears twice")));
        }
    }
    let alignment = read_alignment(&metadata, &c)?;

    if tensor_count > MAX_TENSORS {
        return Err(c.malformed(format!(
            "it declares {tensor_count} tensors; at most {MAX_TENSORS} are accepted"
        )));
    }
    // Smallest tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    let tensor_count = c.check_count(tensor_count, 32, "tensor infos")?;
    let mut raw = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        raw.push(read_tensor_info(&mut c)?);
    }
    let header_end = c.pos as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| c.malformed("the data section offset overflows".into()))?;

    let mut seen = HashSet::with_capacity(raw.len());
    let mut tensors = Vec::with_capacity(raw.len());
    for info in raw {
        if !seen.insert(info.name.clone()) {
            return Err(FormatError::DuplicateTensor {
                path: path.to_path_buf(),
                tensor: info.name,
            });
        }
        tensors.push(info.resolve(path, alignment, data_start, buf.len() as u64)?);
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        data_start,
        alignment,
    })
}

fn read_alignment(metadata: &Metadata, c: &Cursor<'_>) -> Result<u64, FormatError> {
    let Some(value) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() && a <= u64::from(u32::MAX) => Ok(a),
        _ => Err(c.malformed(format!(
            "general.alignment is {value:?}; it must be a power of two"
        ))),
    }
}

/// A tensor info as read, before its type and placement are checked.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

fn read_tensor_info(c: &mut Cursor<'_>) -> Result<RawTensorInfo, FormatError> {
    let name = c.string("a tensor name")?;
    let n_dims = c.u32(&name)?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(FormatError::BadTensor {
            path: c.path.to_path_buf(),
            tensor: name,
            reason: format!("it has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&name)?);
    }
    let type_id = c.u32(&name)?;
    let offset = c.u64(&name)?;
    Ok(RawTensorInfo {
        name,
        dims,
        type_id,
        offset,
    })
}

impl RawTensorInfo {
    /// Checks type, shape and placement; `file_len` bounds the data.
    fn resolve(
        self,
        path: &Path,
        alignment: u64,
        data_start: u64,
        file_len: u64,
    ) -> Result<TensorInfo, FormatError> {
        let bad = |reason: String| FormatError::BadTensor {
            path: path.to_path_buf(),
            tensor: self.name.clone(),
            reason,
        };
        let dtype = DType::from_ggml_id(self.type_id).ok_or_else(|| {
            FormatError::UnsupportedTensorType {
                path: path.to_path_buf(),
                tensor: self.name.clone(),
                type_id: self.type_id,
                type_name: ggml_type_name(self.type_id).to_string(),
            }
        })?;
        // GGUF lists ne[0] (contiguous) first; we keep outermost first.
        let mut shape = Vec::with_capacity(self.dims.len());
        for &d in self.dims.iter().rev() {
            match usize::try_from(d) {
                Ok(d) if d > 0 => shape.push(d),
                _ => {
                    return Err(bad(format!(
                        "dimension {d} is invalid (dims {:?})",
                        self.dims
                    )))
                }
            }
        }
        let elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                bad(format!(
                    "its element count overflows (dims {:?})",
                    self.dims
                ))
            })?;
        let row = shape.last().copied().unwrap_or(1);
        if row % dtype.block_len() != 0 {
            return Err(bad(format!(
                "its rows of {row} elements are not whole {dtype} blocks of {}",
                dtype.block_len()
            )));
        }
        let size = dtype
            .bytes_for(elements)
            .ok_or_else(|| bad(format!("its byte size overflows (dims {:?})", self.dims)))?;
        if !self.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "its data offset {} is not a multiple of the file's alignment {alignment}",
                self.offset
            )));
        }
        let (Some(start), Some(end)) = (
            data_start.checked_add(self.offset),
            data_start
                .checked_add(self.offset)
                .and_then(|s| s.checked_add(size as u64)),
        ) else {
            return Err(bad(format!(
                "its data offset {} plus {size} bytes lies beyond any possible file",
                self.offset
            )));
        };
        if end > file_len {
            return Err(FormatError::TensorOutOfBounds {
                path: path.to_path_buf(),
                tensor: self.name.clone(),
                start,
                end,
                len: file_len,
            });
        }
        Ok(TensorInfo {
            name: self.name,
            dtype,
            shape,
            offset: self.offset,
            size,
        })
    }
}
