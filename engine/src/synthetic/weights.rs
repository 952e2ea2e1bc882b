//! Deterministic random weights for a synthetic model, in Hugging Face
//! convention (Q and K rows in their original order) under GGUF names.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::formats::expected_tensors;
use crate::model::config::ModelConfig;

/// One synthetic tensor: GGUF name, shape (outermost first), f32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Every tensor the forward pass needs for `config`, drawn from `seed`.
///
/// Each tensor has its own generator, seeded from `seed` and its name, so a
/// tensor's values do not depend on which other tensors exist: the same
/// seed gives the same model in every format and type.
pub fn synthetic_tensors(config: &ModelConfig, seed: u64) -> Vec<SyntheticTensor> {
    expected_tensors(config)
        .map(|(name, shape)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ fnv1a(&name));
            let n: usize = shape.iter().product();
            let values = if name.ends_with("_norm.weight") {
                // Norm gains near 1, so activations keep their scale.
                (0..n)
                    .map(|_| 1.0 + rng.random_range(-0.1f32..0.1))
                    .collect()
            } else if name.ends_with(".bias") {
                (0..n).map(|_| rng.random_range(-0.02f32..0.02)).collect()
            } else if name == "token_embd.weight" {
                // Small enough that tied logits (embedding · normed state)
                // stay in single digits.
                (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect()
            } else {
                // Uniform with variance 1/fan_in: outputs keep unit scale.
                let fan_in = shape.last().copied().unwrap_or(1) as f32;
                let a = (3.0 / fan_in).sqrt();
                (0..n).map(|_| rng.random_range(-a..a)).collect()
            };
            SyntheticTensor {
                name,
                shape,
                values,
            }
        })
        .collect()
}

/// llama.cpp's reordering of Q or K rows for GGUF Llama files: within each
/// head, row `half · head_dim/2 + j` moves to `2j + half`, so rotary pairs
/// become adjacent (interleaved rope). `row_len` is 1 for a bias.
pub fn permute_for_interleaved_rope(values: &[f32], n_heads: usize, row_len: usize) -> Vec<f32> {
    let rows = values.len() / row_len.max(1);
    let head_dim = rows / n_heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..n_heads {
        for part in 0..2 {
            for j in 0..half {
                let from = (h * head_dim + part * half + j) * row_len;
                let to = (h * head_dim + 2 * j + part) * row_len;
                out[to..to + row_len].copy_from_slice(&values[from..from + row_len]);
            }
        }
    }
    out
}

/// FNV-1a, to derive a per-tensor seed from its name.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_pairs_halves() {
        // One head of 4 rows of 1: HF order [a0, a1, b0, b1] → [a0, b0, a1, b1].
        let v = [10.0, 11.0, 20.0, 21.0];
        assert_eq!(
            permute_for_interleaved_rope(&v, 1, 1),
            vec![10.0, 20.0, 11.0, 21.0]
        );
        // Two heads of 2 rows of 2 columns.
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(permute_for_interleaved_rope(&v, 2, 2), v);
    }
}
