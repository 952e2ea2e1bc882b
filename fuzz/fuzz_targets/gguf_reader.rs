//! Arbitrary bytes into the GGUF reader: it must return `Ok` or `Err`,
//! never panic, and every tensor of a file it accepts must be readable,
//! in bounds and of the size its type and shape imply.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_engine::formats::gguf::{model_config, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::parse(data) else {
        return;
    };
    for (name, info) in file.tensors() {
        let tensor = file
            .tensor_data(name)
            .expect("a tensor of a parsed file is readable");
        let elements: usize = tensor.shape.iter().product();
        assert_eq!(Some(tensor.data.len()), tensor.dtype.bytes_for(elements));
        assert_eq!(tensor.data.len(), info.size);
        // Touch every byte, as a loader would.
        let sum = tensor.data.iter().fold(0u8, |a, b| a.wrapping_add(*b));
        std::hint::black_box(sum);
    }
    let _ = std::hint::black_box(model_config(&file));
});
