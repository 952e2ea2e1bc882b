//! Tensor-level steps of the demo repository: dequantizing a whole tensor,
//! re-quantizing it, and adding a seeded low-rank delta.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::formats::dequantize_row;
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::{DType, KernelError};

use crate::formats::TensorData;

/// Rank of the delta added to the derived checkpoints' chosen matrices.
pub const DELTA_RANK: usize = 4;

/// RMS of the delta relative to the RMS of the weight it is added to: big
/// enough to move greedy outputs for some prompts, small enough that the
/// model still writes English.
pub const DELTA_STRENGTH: f32 = 0.05;

/// `(rows, cols)` of a tensor: `cols` the innermost dimension, `rows` the
/// product of the others.
pub fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape
        .iter()
        .rev()
        .skip(1)
        .fold(1usize, |acc, &d| acc.saturating_mul(d));
    (rows, cols)
}

/// Every element of `tensor` as f32, row by row.
pub fn dequantize_tensor(tensor: &TensorData) -> Result<Vec<f32>, KernelError> {
    let (rows, cols) = rows_cols(&tensor.shape);
    let row_bytes = tensor.dtype.bytes_for(cols).ok_or(KernelError::RaggedRow {
        dtype: tensor.dtype,
        cols,
        block: tensor.dtype.block_len(),
    })?;
    let mut out = vec![0f32; rows.saturating_mul(cols)];
    if row_bytes.saturating_mul(rows) != tensor.data.len() {
        return Err(KernelError::WrongByteLength {
            dtype: tensor.dtype,
            rows,
            cols,
            expected: row_bytes.saturating_mul(rows),
            actual: tensor.data.len(),
        });
    }
    for (bytes, row) in tensor
        .data
        .chunks_exact(row_bytes.max(1))
        .zip(out.chunks_exact_mut(cols.max(1)))
    {
        dequantize_row(tensor.dtype, bytes, row)?;
    }
    Ok(out)
}

/// `tensor` re-encoded as `dtype` from its dequantized values.
pub fn requantize(tensor: &TensorData, dtype: DType) -> Result<Vec<u8>, KernelError> {
    quantize(dtype, &dequantize_tensor(tensor)?)
}

/// `tensor` plus a rank-[`DELTA_RANK`] matrix `A·B` drawn from `rng`
/// (entries uniform in [-1, 1)), scaled to [`DELTA_STRENGTH`] of the
/// weight's RMS, re-quantized to the tensor's own type.
pub fn add_low_rank_delta(
    tensor: &TensorData,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u8>, KernelError> {
    let (rows, cols) = rows_cols(&tensor.shape);
    let mut weights = dequantize_tensor(tensor)?;
    let a: Vec<f32> = (0..rows * DELTA_RANK)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let b: Vec<f32> = (0..DELTA_RANK * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut delta = vec![0f32; rows * cols];
    for (i, delta_row) in delta.chunks_exact_mut(cols.max(1)).enumerate() {
        for k in 0..DELTA_RANK {
            let a_ik = a.get(i * DELTA_RANK + k).copied().unwrap_or(0.0);
            let b_row = b.get(k * cols..(k + 1) * cols).unwrap_or(&[]);
            for (d, &b_kj) in delta_row.iter_mut().zip(b_row) {
                *d += a_ik * b_kj;
            }
        }
    }
    let scale = DELTA_STRENGTH * rms(&weights) / rms(&delta).max(f32::MIN_POSITIVE);
    for (w, d) in weights.iter_mut().zip(&delta) {
        *w += scale * d;
    }
    quantize(tensor.dtype, &weights)
}

/// A fresh generator for the derived checkpoint of `seed`.
pub fn delta_rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Root mean square, accumulated in f64 so the result does not depend on
/// the tensor's size.
pub fn rms(values: &[f32]) -> f32 {
    if values.is_empty() {
        return 0.0;
    }
    let sum: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    (sum / values.len() as f64).sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4_1_tensor(rows: usize, cols: usize) -> TensorData {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.2)
            .collect();
        TensorData {
            dtype: DType::Q4_1,
            shape: vec![rows, cols],
            data: quantize(DType::Q4_1, &values).unwrap().into(),
        }
    }

    #[test]
    fn delta_is_deterministic_and_small() {
        let t = q4_1_tensor(8, 64);
        let one = add_low_rank_delta(&t, &mut delta_rng(1)).unwrap();
        let again = add_low_rank_delta(&t, &mut delta_rng(1)).unwrap();
        let other = add_low_rank_delta(&t, &mut delta_rng(2)).unwrap();
        assert_eq!(one, again);
        assert_ne!(one, other);
        let base = dequantize_tensor(&t).unwrap();
        let moved = dequantize_tensor(&TensorData {
            data: one.into(),
            ..t.clone()
        })
        .unwrap();
        let diff: Vec<f32> = base.iter().zip(&moved).map(|(a, b)| a - b).collect();
        // The delta plus one more round of 4-bit rounding stays well under
        // the weights' own size.
        assert!(
            rms(&diff) < 0.5 * rms(&base),
            "{} vs {}",
            rms(&diff),
            rms(&base)
        );
        assert!(rms(&diff) > 0.0);
    }

    #[test]
    fn rows_cols_flattens_outer_dimensions() {
        assert_eq!(rows_cols(&[3, 4, 32]), (12, 32));
        assert_eq!(rows_cols(&[7]), (1, 7));
    }
}
