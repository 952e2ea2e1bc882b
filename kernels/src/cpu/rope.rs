//! Rotary position embedding, applied in place to every head of each row.
//!
//! Angles are computed in f64 (`position · inv_freq[i]`, `inv_freq` widened)
//! and their cosine and sine rounded to f32; the rotation itself is f32. At
//! positions in the tens of thousands an f32 angle would already have lost
//! several bits, which f64 avoids at the cost of `head_dim / 2` sin/cos per
//! row, shared by all heads.

use super::disjoint::DisjointSlice;
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::{KernelError, RopeStyle};

pub(crate) fn rope(
    pool: &ThreadPool,
    x: &mut CpuActivations,
    head_dim: usize,
    positions: &[u32],
    inv_freq: &[f32],
    style: RopeStyle,
) -> Result<(), KernelError> {
    if head_dim == 0
        || !head_dim.is_multiple_of(2)
        || !x.cols.is_multiple_of(head_dim)
        || inv_freq.len() != head_dim / 2
        || positions.len() != x.rows
    {
        return Err(KernelError::Shape {
            op: "rope",
            detail: format!(
                "x is {}, head_dim {head_dim}, {} inv_freq values, {} positions; need an even \
                 head_dim dividing x's width, head_dim/2 inv_freq and one position per row",
                x.shape(),
                inv_freq.len(),
                positions.len()
            ),
        });
    }
    let cols = x.cols;
    let data = DisjointSlice::new(&mut x.data);
    pool.for_each_range(x.rows, 4, &|rows| {
        let mut cos = vec![0.0f32; head_dim / 2];
        let mut sin = vec![0.0f32; head_dim / 2];
        for row in rows {
            let position = f64::from(positions[row]);
            for ((c, s), f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
                let (sn, cs) = (position * f64::from(*f)).sin_cos();
                *c = cs as f32;
                *s = sn as f32;
            }
            // SAFETY: each row belongs to exactly one task.
            let row_data = unsafe { data.range(row * cols, cols) };
            for head in row_data.chunks_exact_mut(head_dim) {
                rotate_head(head, &cos, &sin, style);
            }
        }
    });
    Ok(())
}

/// Rotates the pairs of one head by the angles whose cos/sin are given.
pub(crate) fn rotate_head(head: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = head.len() / 2;
    for (i, (c, s)) in cos.iter().zip(sin).enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}
