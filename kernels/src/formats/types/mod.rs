//! One home per GGUF block type (as candle's `quantized/k_quants.rs`): its
//! byte layout (offsets and the accessors the kernels read it through),
//! its scalar dequantization and its quantizer, behind [`BlockFormat`].
//! Every backend's kernels read blocks through these layouts, and tests
//! hold them to these dequantizers (the oracle).
//!
//! ```
//! use switchyard_kernels::formats::types::{BlockFormat, Q8_0};
//! let mut bytes = Vec::new();
//! Q8_0::quantize(&[0.5; 32], &mut bytes);
//! let mut back = [0.0; 32];
//! Q8_0::dequantize(&bytes, &mut back);
//! assert_eq!(bytes.len(), Q8_0::BLOCK_BYTES);
//! assert!((back[7] - 0.5).abs() < 0.5 / 127.0);
//! ```

pub(crate) mod floats;
pub(crate) mod iq4_nl;
pub(crate) mod iq4_xs;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;

pub use floats::{BF16, F16, F32};
pub use iq4_nl::IQ4NL;
pub use iq4_xs::IQ4XS;
pub use q2_k::Q2K;
pub use q3_k::Q3K;
pub use q4_0::Q4_0;
pub use q4_1::Q4_1;
pub use q4_k::Q4K;
pub use q5_0::Q5_0;
pub use q5_1::Q5_1;
pub use q5_k::Q5K;
pub use q6_k::Q6K;
pub use q8_0::Q8_0;

use crate::DType;

/// One GGUF block type.
pub trait BlockFormat {
    /// The type's tag.
    const DTYPE: DType;
    /// Elements per block.
    const BLOCK_LEN: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// One block (`BLOCK_BYTES`) to its `BLOCK_LEN` values, with ggml's
    /// formulas in ggml's order of f32 operations.
    fn dequantize(block: &[u8], out: &mut [f32]);
    /// `BLOCK_LEN` values appended to `out` as one block. The simple
    /// quantizers (absolute maximum or min/max per block and sub-block),
    /// not ggml's error-minimising searches: round trips are close, not
    /// bit-identical to llama.cpp's.
    fn quantize(values: &[f32], out: &mut Vec<u8>);
}

/// Calls `$body` with `$t` bound to `$dtype`'s [`BlockFormat`] type.
macro_rules! with_format {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = F32;
                $body
            }
            DType::F16 => {
                type $t = F16;
                $body
            }
            DType::BF16 => {
                type $t = BF16;
                $body
            }
            DType::Q8_0 => {
                type $t = Q8_0;
                $body
            }
            DType::Q4_0 => {
                type $t = Q4_0;
                $body
            }
            DType::Q4_1 => {
                type $t = Q4_1;
                $body
            }
            DType::Q5_0 => {
                type $t = Q5_0;
                $body
            }
            DType::Q5_1 => {
                type $t = Q5_1;
                $body
            }
            DType::Q2K => {
                type $t = Q2K;
                $body
            }
            DType::Q3K => {
                type $t = Q3K;
                $body
            }
            DType::Q4K => {
                type $t = Q4K;
                $body
            }
            DType::Q5K => {
                type $t = Q5K;
                $body
            }
            DType::Q6K => {
                type $t = Q6K;
                $body
            }
            DType::IQ4NL => {
                type $t = IQ4NL;
                $body
            }
            DType::IQ4XS => {
                type $t = IQ4XS;
                $body
            }
        }
    };
}

/// One block of `dtype` (`block.len() == block_bytes`, `out.len() == block_len`).
pub(crate) fn dequantize_block(dtype: DType, block: &[u8], out: &mut [f32]) {
    with_format!(dtype, T => T::dequantize(block, out))
}

/// `values` (whole blocks of `dtype`) appended to `out`.
pub(crate) fn quantize_blocks(dtype: DType, values: &[f32], out: &mut Vec<u8>) {
    with_format!(dtype, T => values
        .chunks_exact(T::BLOCK_LEN)
        .for_each(|b| T::quantize(b, out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_says_the_size_its_dtype_does() {
        for dtype in DType::ALL {
            let (len, bytes) = with_format!(dtype, T => (T::BLOCK_LEN, T::BLOCK_BYTES));
            assert_eq!(
                (len, bytes),
                (dtype.block_len(), dtype.block_bytes()),
                "{dtype}"
            );
            with_format!(dtype, T => assert_eq!(T::DTYPE, dtype));
        }
    }
}
