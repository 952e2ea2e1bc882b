//! Dequantization of every [`DType`] to f32 (scalar; used for embeddings and
//! tests, never in the matmul hot loop).

use super::types::dequantize_block;
use crate::{DType, KernelError};

/// Dequantizes one row of `out.len()` elements stored as `dtype` in `bytes`
/// with ggml's formulas: Q4_0 `(q-8)·d`, Q4_1 `q·d + m`, Q8_0 `q·d`, Q4_K
/// `d·sc·q - dmin·m` per 32-element sub-block, Q6_K `d·sc·(q-32)` per 16,
/// Q5_0 `(q-16)·d`, Q5_1 `q·d + m`; the other K and the IQ4 types as
/// their types (`types/`) say.
///
/// Errors when `out.len()` is not a whole number of blocks or `bytes` is not
/// exactly that many blocks.
pub fn dequantize_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    let cols = out.len();
    let expected = dtype.bytes_for(cols).ok_or(KernelError::RaggedRow {
        dtype,
        cols,
        block: dtype.block_len(),
    })?;
    if bytes.len() != expected {
        return Err(KernelError::WrongByteLength {
            dtype,
            rows: 1,
            cols,
            expected,
            actual: bytes.len(),
        });
    }
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    let outs = out.chunks_exact_mut(dtype.block_len());
    for (block, out) in blocks.zip(outs) {
        dequantize_block(dtype, block, out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_le_bytes()
    }

    fn dequant(dtype: DType, bytes: &[u8], n: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; n];
        dequantize_row(dtype, bytes, &mut out).unwrap();
        out
    }

    #[test]
    fn float_types() {
        let raw: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(dequant(DType::F32, &raw, 2), [1.5, -2.25]);
        let raw: Vec<u8> = [f16(0.5), f16(-3.0)].concat();
        assert_eq!(dequant(DType::F16, &raw, 2), [0.5, -3.0]);
        // bf16 is the top half of the f32: 1.0 = 0x3F80, -2.0 = 0xC000.
        assert_eq!(
            dequant(DType::BF16, &[0x80, 0x3F, 0x00, 0xC0], 2),
            [1.0, -2.0]
        );
    }

    #[test]
    fn q8_0_block() {
        let mut block = f16(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequant(DType::Q8_0, &block, 32);
        assert_eq!(out[0], -8.0);
        assert_eq!(out[16], 0.0);
        assert_eq!(out[31], 7.5);
    }

    #[test]
    fn q4_0_and_q4_1_nibble_order() {
        // Byte j holds element j (low nibble) and element j + 16 (high).
        let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let block = [f16(2.0).to_vec(), qs.clone()].concat();
        let out = dequant(DType::Q4_0, &block, 32);
        assert_eq!(out[0], (0.0 - 8.0) * 2.0);
        assert_eq!(out[3], (3.0 - 8.0) * 2.0);
        assert_eq!(out[16], (15.0 - 8.0) * 2.0);
        assert_eq!(out[31], (0.0 - 8.0) * 2.0);

        let block = [f16(0.25).to_vec(), f16(-1.0).to_vec(), qs].concat();
        let out = dequant(DType::Q4_1, &block, 32);
        assert_eq!(out[5], 5.0 * 0.25 - 1.0);
        assert_eq!(out[16 + 5], 10.0 * 0.25 - 1.0);
    }

    #[test]
    fn q4_k_scales_mins_and_nibbles() {
        let mut block = vec![0u8; 144];
        block[0..2].copy_from_slice(&f16(0.5));
        block[2..4].copy_from_slice(&f16(0.25));
        // Sub-block 1: scale 3 (byte 1 low six bits), min 5 (byte 5).
        block[4 + 1] = 3;
        block[4 + 5] = 5;
        // Sub-block 6: scale = (byte 10 & 15) | (byte 2 >> 6) << 4 = 2 | 1 << 4 = 18;
        //              min   = (byte 10 >> 4) | (byte 6 >> 6) << 4 = 1 | 2 << 4 = 33.
        block[4 + 10] = 0x12;
        block[4 + 2] = 0b0100_0000;
        block[4 + 6] = 0b1000_0000;
        // Element 32 + 7 is sub-block 1: high nibble of qs[7]. Element
        // 192 + 4 is sub-block 6: low nibble of qs[96 + 4].
        block[16 + 7] = 0x90;
        block[16 + 100] = 0x0B;
        let out = dequant(DType::Q4K, &block, 256);
        assert_eq!(out[39], 0.5 * 3.0 * 9.0 - 0.25 * 5.0);
        assert_eq!(out[196], 0.5 * 18.0 * 11.0 - 0.25 * 33.0);
        assert_eq!(out[38], -0.25 * 5.0);
        // Sub-block 0 has scale (byte 0 & 63) = 0 and min (byte 4 & 63) = 0.
        assert_eq!(out[0], 0.0);
    }

    #[test]
    fn q6_k_bits_and_scales() {
        let mut block = vec![0u8; 210];
        block[208..210].copy_from_slice(&f16(0.5));
        for (i, s) in block[192..208].iter_mut().enumerate() {
            *s = (i as i8 - 8) as u8;
        }
        // Element 64 + 3 (first half, third quarter): high nibble of ql[3],
        // bits 4-5 of qh[3].
        block[3] = 0xA0;
        block[128 + 3] = 0b0010_0000;
        // Element 128 + 32 + 20 (second half, second quarter): low nibble of
        // ql[64 + 32 + 20], bits 2-3 of qh[32 + 20].
        block[64 + 52] = 0x07;
        block[128 + 52] = 0b0000_1100;
        let out = dequant(DType::Q6K, &block, 256);
        // q = 10 | 2 << 4 = 42; scale index 67 / 16 = 4 -> -4.
        assert_eq!(out[67], 0.5 * -4.0 * (42.0 - 32.0));
        // q = 7 | 3 << 4 = 55; scale index 8 + 52 / 16 = 11 -> 3.
        assert_eq!(out[180], 0.5 * 3.0 * (55.0 - 32.0));
        // A zero quant is -32 times its scale.
        assert_eq!(out[0], 0.5 * -8.0 * -32.0);
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let mut out = vec![0.0; 33];
        assert!(matches!(
            dequantize_row(DType::Q8_0, &[0; 34], &mut out),
            Err(KernelError::RaggedRow { .. })
        ));
        let mut out = vec![0.0; 32];
        assert!(matches!(
            dequantize_row(DType::Q8_0, &[0; 33], &mut out),
            Err(KernelError::WrongByteLength {
                expected: 34,
                actual: 33,
                ..
            })
        ));
    }
}
