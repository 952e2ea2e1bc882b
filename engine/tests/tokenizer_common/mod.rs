//! Test helpers shared by the tokenizer tests: a minimal GGUF metadata
//! reader (so these tests do not depend on the crate's GGUF reader).

#![allow(dead_code)]

use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use switchyard_engine::formats::gguf::{MetaValue, Metadata};
use switchyard_engine::formats::TokenizerSource;

/// The tokenizer source of a GGUF file, metadata read by [`read_metadata`].
pub fn gguf_source(path: &Path) -> TokenizerSource {
    TokenizerSource::Gguf {
        file: path.to_path_buf(),
        metadata: Arc::new(read_metadata(path)),
    }
}

/// Reads the key/value header of a GGUF v2/v3 file.
pub fn read_metadata(path: &Path) -> Metadata {
    let mut r = BufReader::new(std::fs::File::open(path).unwrap());
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"GGUF", "{} is not a GGUF file", path.display());
    let version = read_u32(&mut r);
    assert!(version == 2 || version == 3, "GGUF version {version}");
    let _tensor_count = read_u64(&mut r);
    let kv_count = read_u64(&mut r);
    let mut metadata = Metadata::default();
    for _ in 0..kv_count {
        let key = read_string(&mut r);
        let kind = read_u32(&mut r);
        let value = read_value(&mut r, kind);
        metadata.insert(key, value);
    }
    metadata
}

fn read_value(r: &mut impl Read, kind: u32) -> MetaValue {
    match kind {
        0 => MetaValue::U8(read_bytes::<1>(r)[0]),
        1 => MetaValue::I8(read_bytes::<1>(r)[0] as i8),
        2 => MetaValue::U16(u16::from_le_bytes(read_bytes(r))),
        3 => MetaValue::I16(i16::from_le_bytes(read_bytes(r))),
        4 => MetaValue::U32(read_u32(r)),
        5 => MetaValue::I32(i32::from_le_bytes(read_bytes(r))),
        6 => MetaValue::F32(f32::from_le_bytes(read_bytes(r))),
        7 => MetaValue::Bool(read_bytes::<1>(r)[0] != 0),
        8 => MetaValue::String(read_string(r)),
        9 => {
            let item_kind = read_u32(r);
            let n = read_u64(r);
            MetaValue::Array((0..n).map(|_| read_value(r, item_kind)).collect())
        }
        10 => MetaValue::U64(read_u64(r)),
        11 => MetaValue::I64(i64::from_le_bytes(read_bytes(r))),
        12 => MetaValue::F64(f64::from_le_bytes(read_bytes(r))),
        other => panic!("unknown GGUF value type {other}"),
    }
}

fn read_bytes<const N: usize>(r: &mut impl Read) -> [u8; N] {
    let mut b = [0u8; N];
    r.read_exact(&mut b).unwrap();
    b
}

fn read_u32(r: &mut impl Read) -> u32 {
    u32::from_le_bytes(read_bytes(r))
}

fn read_u64(r: &mut impl Read) -> u64 {
    u64::from_le_bytes(read_bytes(r))
}

fn read_string(r: &mut impl Read) -> String {
    let len = read_u64(r) as usize;
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}
