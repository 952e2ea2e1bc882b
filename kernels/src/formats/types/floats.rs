//! The float types, one element a block: F32, F16, BF16 (little-endian).

use half::{bf16, f16};

use super::BlockFormat;
use crate::formats::read::{bf16_at, f16_at};
use crate::DType;

pub struct F32;
pub struct F16;
pub struct BF16;

impl BlockFormat for F32 {
    const DTYPE: DType = DType::F32;
    const BLOCK_LEN: usize = 1;
    const BLOCK_BYTES: usize = 4;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    }

    fn quantize(values: &[f32], out: &mut Vec<u8>) {
        out.extend_from_slice(&values[0].to_le_bytes());
    }
}

impl BlockFormat for F16 {
    const DTYPE: DType = DType::F16;
    const BLOCK_LEN: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        out[0] = f16_at(block, 0);
    }

    fn quantize(values: &[f32], out: &mut Vec<u8>) {
        out.extend_from_slice(&f16::from_f32(values[0]).to_le_bytes());
    }
}

impl BlockFormat for BF16 {
    const DTYPE: DType = DType::BF16;
    const BLOCK_LEN: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn dequantize(block: &[u8], out: &mut [f32]) {
        out[0] = bf16_at(block, 0);
    }

    fn quantize(values: &[f32], out: &mut Vec<u8>) {
        out.extend_from_slice(&bf16::from_f32(values[0]).to_le_bytes());
    }
}
