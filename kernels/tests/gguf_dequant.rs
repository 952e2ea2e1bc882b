//! Dequantization of every quantized type against the `gguf` Python
//! package's, on random blocks: `tests/python/quant_fixtures.py` wrote the
//! blocks and the package's values (and `test_quant_fixtures.py` checks the
//! committed files are still what the package gives).
//!
//! Both sides evaluate ggml's formulas in f32 in the same order (a scale
//! product, then the quant times it, then the min), so the values must be
//! equal bit for bit: no tolerance.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::PathBuf;

use switchyard_kernels::cpu::dequantize_row;
use switchyard_kernels::DType;

fn fixture(name: &str, ext: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf_dequant")
        .join(format!("{name}.{ext}"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (every quantized type needs a fixture: run tests/python/quant_fixtures.py)",
            path.display()
        )
    })
}

#[test]
fn dequantization_equals_the_gguf_packages() {
    for dtype in DType::ALL.into_iter().filter(|t| t.is_quantized()) {
        let blocks = fixture(dtype.name(), "blocks");
        let want: Vec<f32> = fixture(dtype.name(), "f32")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // As rows of 512 elements (several blocks each), as a matrix is read.
        let row_len = 512;
        let row_bytes = dtype.bytes_for(row_len).expect("whole blocks");
        assert_eq!(blocks.len(), want.len() / row_len * row_bytes, "{dtype}");
        let mut got = vec![f32::NAN; want.len()];
        for (bytes, out) in blocks
            .chunks_exact(row_bytes)
            .zip(got.chunks_exact_mut(row_len))
        {
            dequantize_row(dtype, bytes, out).unwrap();
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{dtype} element {i} (block {}): got {g}, gguf gives {w}",
                i / dtype.block_len()
            );
        }
        println!("{dtype}: {} values equal gguf's", want.len());
    }
}
