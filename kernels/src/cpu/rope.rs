//! Rotary position embedding, applied in place to every head of each row.
//!
//! Angles are computed in f64 (`position · inv_freq[i]`, `inv_freq` widened)
//! and their cosine and sine rounded to f32; the rotation itself is f32. At
//! positions in the tens of thousands an f32 angle would already have lost
//! several bits, which f64 avoids at the cost of `head_dim / 2` sin/cos per
//! row, shared by all heads. Each thread keeps the cos/sin it computed per
//! position (`AngleTable`): a step ropes Q and K of every layer at the same
//! positions, so f64 `sin_cos` runs once per position and thread instead
//! of `2 · layers` times per row (it was 1-1.5% of batched decode).

use std::cell::RefCell;

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
        ANGLES.with(|tables| {
            let mut fresh = None;
            let mut tables = tables.try_borrow_mut();
            let table = match tables.as_deref_mut() {
                Ok(tables) => for_freq(tables, inv_freq),
                // Only a nested call on this thread gets here (the table
                // is made here, not on every call: one row's rope is
                // serial work between the step's jobs).
                Err(_) => fresh.insert(AngleTable::new(inv_freq)),
            };
            for row in rows {
                let (cos, sin) = table.angles(positions[row]);
                // SAFETY: each row belongs to exactly one task.
                let row_data = unsafe { data.range(row * cols, cols) };
                for head in row_data.chunks_exact_mut(head_dim) {
                    rotate_head(head, cos, sin, style);
                }
            }
        })
    });
    Ok(())
}

/// Positions whose angles a thread keeps (beyond, they are computed per
/// call): 32K positions of a 128-wide head take 32 MB.
const TABLE_POSITIONS: usize = 32 * 1024;

/// Frequency sets a thread keeps tables for: Gemma 3's local and global
/// layers rotate with different bases, and one table refilled at every
/// switch between them recomputed every angle.
const TABLES: usize = 4;

thread_local! {
    static ANGLES: RefCell<Vec<AngleTable>> = const { RefCell::new(Vec::new()) };
}

/// This thread's table for `inv_freq`, made (dropping the others once
/// [`TABLES`] are kept) if it has none.
fn for_freq<'t>(tables: &'t mut Vec<AngleTable>, inv_freq: &[f32]) -> &'t mut AngleTable {
    let found = tables.iter().position(|t| t.inv_freq == inv_freq);
    let at = found.unwrap_or_else(|| {
        if tables.len() >= TABLES {
            tables.clear();
        }
        tables.push(AngleTable::new(inv_freq));
        tables.len() - 1
    });
    &mut tables[at]
}

/// cos/sin per position for one `inv_freq`, filled as positions come.
struct AngleTable {
    inv_freq: Vec<f32>,
    known: Vec<bool>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl AngleTable {
    fn new(inv_freq: &[f32]) -> AngleTable {
        AngleTable {
            inv_freq: inv_freq.to_vec(),
            known: Vec::new(),
            cos: Vec::new(),
            sin: Vec::new(),
        }
    }

    /// The cos and sin (`inv_freq.len()` each) at `position`.
    fn angles(&mut self, position: u32) -> (&[f32], &[f32]) {
        let half = self.inv_freq.len();
        let p = position as usize;
        let slot = if p < TABLE_POSITIONS {
            if p >= self.known.len() {
                self.known.resize(p + 1, false);
                self.cos.resize((p + 1) * half, 0.0);
                self.sin.resize((p + 1) * half, 0.0);
            }
            p
        } else {
            // Past the table: one scratch slot after it, recomputed.
            let end = self.known.len();
            self.cos.resize((end + 1) * half, 0.0);
            self.sin.resize((end + 1) * half, 0.0);
            end
        };
        let (cos, sin) = (
            &mut self.cos[slot * half..(slot + 1) * half],
            &mut self.sin[slot * half..(slot + 1) * half],
        );
        if self.known.get(p) != Some(&true) {
            let position = f64::from(position);
            for ((c, s), f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
                let (sn, cs) = (position * f64::from(*f)).sin_cos();
                *c = cs as f32;
                *s = sn as f32;
            }
            if let Some(known) = self.known.get_mut(p) {
                *known = true;
            }
        }
        (cos, sin)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_angle_tables_return_what_they_would_compute() {
        let inv_freq: Vec<f32> = (0..8).map(|i| 10000f32.powf(-(i as f32) / 8.0)).collect();
        let sets: Vec<Vec<f32>> = (0..=TABLES)
            .map(|k| inv_freq.iter().map(|f| f * (k + 1) as f32).collect())
            .collect();
        let mut tables = Vec::new();
        let positions = [3u32, 40_000, 3, 7, 40_001, 0, 32_767, 32_768, 7];
        // Alternating sets (Gemma 3's local and global layers), and more
        // sets than are kept.
        for (round, p) in positions.into_iter().enumerate() {
            let freqs = &sets[round % sets.len()];
            let (cos, sin) = for_freq(&mut tables, freqs).angles(p);
            for ((c, s), f) in cos.iter().zip(sin).zip(freqs) {
                let (sn, cs) = (f64::from(p) * f64::from(*f)).sin_cos();
                assert_eq!((*c, *s), (cs as f32, sn as f32), "position {p}");
            }
            assert!(tables.len() <= TABLES);
        }
    }
}
