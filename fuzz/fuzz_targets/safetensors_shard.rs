//! Arbitrary bytes as one safetensors file: the header (JSON, dtypes, shapes,
//! offsets) must be refused with an error or yield tensors that lie inside the
//! file and have the size their dtype and shape imply; never a panic.

#![no_main]

use std::collections::BTreeMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use switchyard_engine::formats::safetensors::shard_tensors;

fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    let mut tensors = BTreeMap::new();
    if shard_tensors(bytes, Path::new("fuzz.safetensors"), &mut tensors).is_err() {
        return;
    }
    for tensor in tensors.values() {
        let elements = tensor.shape.iter().try_fold(1usize, |a, b| a.checked_mul(*b));
        let expected = elements.and_then(|n| tensor.dtype.bytes_for(n));
        assert_eq!(expected, Some(tensor.data.len()));
    }
});
