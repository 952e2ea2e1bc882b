//! Quantizers: f32 → each block format (scalar; used offline to make
//! checkpoints, never on the serving path).
//!
//! Each type's quantizer lives with its layout (`types/`, [`BlockFormat`]).
//!
//! [`BlockFormat`]: super::types::BlockFormat

use crate::{DType, KernelError};

/// Encodes `values` (any whole number of `dtype` blocks) as `dtype`.
///
/// ```
/// use switchyard_kernels::{formats::quantize::quantize, DType};
/// let bytes = quantize(DType::Q8_0, &[0.5; 32]).unwrap();
/// assert_eq!(bytes.len(), 34);
/// ```
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>, KernelError> {
    let block = dtype.block_len();
    if !values.len().is_multiple_of(block) {
        return Err(KernelError::RaggedRow {
            dtype,
            cols: values.len(),
            block,
        });
    }
    let mut out = Vec::with_capacity(values.len() / block * dtype.block_bytes());
    super::types::quantize_blocks(dtype, values, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use rand::{Rng, SeedableRng};

    fn f16_at(b: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
    }

    /// A plain scalar reading of ggml's layouts, independent of the encoder.
    fn dequantize(dtype: DType, b: &[u8]) -> Vec<f32> {
        let mut y = Vec::new();
        match dtype {
            DType::F32 => b
                .chunks_exact(4)
                .for_each(|c| y.push(f32::from_le_bytes(c.try_into().unwrap()))),
            DType::F16 => b.chunks_exact(2).for_each(|c| y.push(f16_at(c, 0))),
            DType::BF16 => b
                .chunks_exact(2)
                .for_each(|c| y.push(bf16::from_le_bytes([c[0], c[1]]).to_f32())),
            DType::Q8_0 => b.chunks_exact(34).for_each(|c| {
                let d = f16_at(c, 0);
                y.extend(c[2..].iter().map(|&q| d * f32::from(q as i8)));
            }),
            DType::Q4_0 => b.chunks_exact(18).for_each(|c| {
                let d = f16_at(c, 0);
                let qs = &c[2..];
                y.extend(qs.iter().map(|q| d * (f32::from(q & 15) - 8.0)));
                y.extend(qs.iter().map(|q| d * (f32::from(q >> 4) - 8.0)));
            }),
            DType::Q4_1 => b.chunks_exact(20).for_each(|c| {
                let (d, m) = (f16_at(c, 0), f16_at(c, 2));
                let qs = &c[4..];
                y.extend(qs.iter().map(|q| d * f32::from(q & 15) + m));
                y.extend(qs.iter().map(|q| d * f32::from(q >> 4) + m));
            }),
            DType::Q5_0 | DType::Q5_1 => b.chunks_exact(dtype.block_bytes()).for_each(|c| {
                let has_min = dtype == DType::Q5_1;
                let d = f16_at(c, 0);
                let m = if has_min { f16_at(c, 2) } else { -16.0 * d };
                let rest = &c[if has_min { 4 } else { 2 }..];
                let qh = u32::from_le_bytes(rest[..4].try_into().unwrap());
                let qs = &rest[4..];
                let fifth = |j: usize| if qh >> j & 1 == 1 { 16.0 } else { 0.0 };
                y.extend((0..16).map(|j| d * (f32::from(qs[j] & 15) + fifth(j)) + m));
                y.extend((0..16).map(|j| d * (f32::from(qs[j] >> 4) + fifth(j + 16)) + m));
            }),
            // The library's dequantizer, which tests/gguf_dequant.rs checks
            // bit for bit against the `gguf` package's.
            DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4NL | DType::IQ4XS => {
                y = vec![0.0; b.len() / dtype.block_bytes() * dtype.block_len()];
                crate::formats::dequantize_row(dtype, b, &mut y).unwrap();
            }
            DType::Q4K => b.chunks_exact(144).for_each(|c| {
                let (d, dmin, s, qs) = (f16_at(c, 0), f16_at(c, 2), &c[4..16], &c[16..]);
                let scale_min = |j: usize| {
                    if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        (
                            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                        )
                    }
                };
                for (k, q) in qs.chunks_exact(32).enumerate() {
                    let (sc1, m1) = scale_min(2 * k);
                    let (sc2, m2) = scale_min(2 * k + 1);
                    let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
                    let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
                    y.extend(q.iter().map(|v| d1 * f32::from(v & 15) - min1));
                    y.extend(q.iter().map(|v| d2 * f32::from(v >> 4) - min2));
                }
            }),
            DType::Q6K => b.chunks_exact(210).for_each(|c| {
                let (ql, qh, sc) = (&c[..128], &c[128..192], &c[192..208]);
                let d = f16_at(c, 208);
                for n in 0..2 {
                    let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                    let mut part = [0f32; 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = (ql[l] & 15) | ((qh[l] & 3) << 4);
                        let q2 = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                        let q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        let q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                        let v = |q: u8, s: u8| d * f32::from(s as i8) * (f32::from(q) - 32.0);
                        part[l] = v(q1, sc[is]);
                        part[l + 32] = v(q2, sc[is + 2]);
                        part[l + 64] = v(q3, sc[is + 4]);
                        part[l + 96] = v(q4, sc[is + 6]);
                    }
                    y.extend_from_slice(&part);
                }
            }),
        }
        y
    }

    fn sample(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// Worst error allowed per element, as a fraction of the largest
    /// magnitude in the input: half a quantization step, plus slack for
    /// the f16 scales and the coarser two-level scales of the K types.
    fn tolerance(dtype: DType) -> f32 {
        match dtype {
            DType::F32 => 0.0,
            DType::F16 => 1e-3,
            DType::BF16 => 4e-3,
            DType::Q8_0 => 1.0 / 127.0 * 0.5 + 1e-3,
            // The largest magnitude maps to -8, so the other sign reaches only +7.
            DType::Q4_0 => 1.0 / 8.0 + 1e-2,
            DType::Q4_1 => 2.0 / 15.0 * 0.5 + 1e-2,
            DType::Q4K => 2.0 / 15.0 * 0.5 + 4e-2,
            DType::Q6K => 1.0 / 31.0 * 0.5 + 1e-2,
            // As Q4_0 and Q4_1, with twice the levels.
            DType::Q5_0 => 1.0 / 16.0 + 1e-2,
            DType::Q5_1 => 2.0 / 31.0 * 0.5 + 1e-2,
            // Half a step of 3 levels over a sub-block's range (up to twice
            // the magnitude), plus the rounded-up 4-bit scales.
            DType::Q2K => 2.0 / 3.0 * 0.5 + 0.1,
            // The largest magnitude maps to -4, so the other sign reaches
            // only +3: a whole step of 1/4, plus the 6-bit scales' rounding.
            DType::Q3K => 1.0 / 4.0 + 4e-2,
            DType::Q5K => 2.0 / 31.0 * 0.5 + 4e-2,
            // The largest magnitude maps to -127, so the other sign reaches
            // only the table's 113 (more than half its widest gap, 23),
            // plus the IQ4_XS 6-bit scales' rounding.
            DType::IQ4NL => 14.0 / 127.0 + 1e-2,
            DType::IQ4XS => 14.0 / 127.0 + 4e-2,
        }
    }

    #[test]
    fn round_trips_stay_within_the_tolerance_of_each_type() {
        for dtype in DType::ALL {
            let x = sample(1024, 7);
            let bytes = quantize(dtype, &x).unwrap();
            assert_eq!(Some(bytes.len()), dtype.bytes_for(x.len()), "{dtype}");
            let y = dequantize(dtype, &bytes);
            assert_eq!(y.len(), x.len(), "{dtype}");
            let worst = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst <= tolerance(dtype), "{dtype}: worst error {worst}");
        }
    }

    #[test]
    fn scales_follow_each_block() {
        // Blocks of very different magnitudes: each keeps its own precision.
        let mut x = sample(512, 3);
        // (Much smaller would push the f16 super-block scales into subnormals.)
        x[..256].iter_mut().for_each(|v| *v *= 1e-2);
        for dtype in DType::ALL {
            let y = dequantize(dtype, &quantize(dtype, &x).unwrap());
            for (block_x, block_y) in x.chunks(256).zip(y.chunks(256)) {
                let scale = block_x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let worst = block_x
                    .iter()
                    .zip(block_y)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    worst <= tolerance(dtype) * scale * 1.5,
                    "{dtype}: {worst} vs {scale}"
                );
            }
        }
    }

    #[test]
    fn zeros_and_constants_are_exact_enough() {
        for dtype in DType::ALL {
            let zeros = vec![0.0f32; 256];
            assert_eq!(
                dequantize(dtype, &quantize(dtype, &zeros).unwrap()),
                zeros,
                "{dtype}"
            );
            let ones = vec![1.0f32; 256];
            let y = dequantize(dtype, &quantize(dtype, &ones).unwrap());
            assert!(y.iter().all(|v| (v - 1.0).abs() < 0.07), "{dtype}: {y:?}");
        }
    }

    #[test]
    fn ragged_input_is_an_error() {
        let err = quantize(DType::Q4K, &[0.0; 300]).unwrap_err();
        assert!(err.to_string().contains("300"), "{err}");
        assert!(quantize(DType::Q8_0, &[0.0; 33]).is_err());
        assert!(quantize(DType::F16, &[0.0; 33]).is_ok());
    }

    #[test]
    fn q4_0_layout_matches_ggml() {
        // Element 0 is the largest magnitude (-8 after scaling), so d = 1/8
        // exactly and every value is representable.
        let x: Vec<f32> = (0..32).map(|i| ((i % 16) as f32 - 8.0) / 8.0).collect();
        let b = quantize(DType::Q4_0, &x).unwrap();
        assert_eq!(f16_at(&b, 0), 0.125);
        // Byte j: element j in the low nibble, element j + 16 in the high.
        assert_eq!(b[2], 0x00);
        assert_eq!(b[3], 0x11);
        assert_eq!(dequantize(DType::Q4_0, &b), x);
    }
}
