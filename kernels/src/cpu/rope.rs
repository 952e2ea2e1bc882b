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
            let mut fresh = AngleTable::default();
            let mut tables = tables.try_borrow_mut();
            let table = match tables.as_deref_mut() {
                Ok(tables) => tables.select(inv_freq),
                // Only a nested call on this thread gets here.
                Err(_) => &mut fresh,
            };
            for row in rows {
                let (cos, sin) = table.angles(inv_freq, positions[row]);
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

/// Tables a thread keeps, one per `inv_freq`: Gemma 3's local and global
/// layers rotate with different bases, and one table switching between
/// them was refilled up to the position at every switch (6 times a step,
/// a 16 MB memset per switch at 16k: 12% of a decode step there).
const TABLES: usize = 4;

thread_local! {
    static ANGLES: RefCell<AngleTables> = RefCell::new(AngleTables::default());
}

/// Up to [`TABLES`] angle tables, the oldest dropped for a new `inv_freq`.
#[derive(Default)]
struct AngleTables(Vec<AngleTable>);

impl AngleTables {
    /// The table for `inv_freq`, made when there is none.
    fn select(&mut self, inv_freq: &[f32]) -> &mut AngleTable {
        let at = match self.0.iter().position(|t| t.inv_freq == inv_freq) {
            Some(at) => at,
            None => {
                if self.0.len() >= TABLES {
                    self.0.remove(0);
                }
                self.0.push(AngleTable {
                    inv_freq: inv_freq.to_vec(),
                    ..AngleTable::default()
                });
                self.0.len() - 1
            }
        };
        &mut self.0[at]
    }
}

/// cos/sin per position for one `inv_freq`, filled as positions come.
#[derive(Default)]
struct AngleTable {
    inv_freq: Vec<f32>,
    known: Vec<bool>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl AngleTable {
    /// The cos and sin (`inv_freq.len()` each) at `position`.
    fn angles(&mut self, inv_freq: &[f32], position: u32) -> (&[f32], &[f32]) {
        let half = inv_freq.len();
        if self.inv_freq != inv_freq {
            *self = AngleTable {
                inv_freq: inv_freq.to_vec(),
                ..AngleTable::default()
            };
        }
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
            for ((c, s), f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
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
    fn each_inv_freq_keeps_its_own_table() {
        let local = vec![0.25f32; 4];
        let global = vec![0.5f32; 4];
        let mut tables = AngleTables::default();
        for _ in 0..3 {
            tables.select(&local).angles(&local, 1000);
            tables.select(&global).angles(&global, 1000);
        }
        assert_eq!(tables.0.len(), 2);
        for (table, freqs) in tables.0.iter_mut().zip([&local, &global]) {
            assert_eq!(table.known.len(), 1001);
            let (cos, _) = table.angles(freqs, 1000);
            assert_eq!(cos[0], (1000.0 * f64::from(freqs[0])).cos() as f32);
        }
        for i in 0..TABLES + 1 {
            tables.select(&[i as f32; 4]);
        }
        assert_eq!(tables.0.len(), TABLES);
    }

    #[test]
    fn the_angle_table_returns_what_it_would_compute() {
        let inv_freq: Vec<f32> = (0..8).map(|i| 10000f32.powf(-(i as f32) / 8.0)).collect();
        let other = vec![0.5f32; 8];
        let mut table = AngleTable::default();
        let positions = [3u32, 40_000, 3, 7, 40_001, 0, 32_767, 32_768, 7];
        for (round, p) in positions.into_iter().enumerate() {
            let freqs = if round == 5 { &other } else { &inv_freq };
            let (cos, sin) = table.angles(freqs, p);
            for ((c, s), f) in cos.iter().zip(sin).zip(freqs) {
                let (sn, cs) = (f64::from(p) * f64::from(*f)).sin_cos();
                assert_eq!((*c, *s), (cs as f32, sn as f32), "position {p}");
            }
        }
    }
}
