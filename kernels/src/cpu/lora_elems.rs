//! How the elements of an adapter's rows are stored, for the LoRA shrink
//! (`lora_shrink`) and expand (`lora_expand`) kernels and their SIMD
//! children alike (its own module so that none of them reaches a parent).
//!
//! A BF16 adapter matrix is stored **tiled** (`Backend::lora_matrix`
//! rearranges it once, at upload), for the two costs a decode step's
//! update meets, one row against each adapter:
//! - widening: each block of 32 columns of a row is one 64-byte tile of
//!   sixteen 32-bit words, word `m` holding column `m` in its low half and
//!   column `16 + m` in its high half, so a tile widens to its 32 f32 in
//!   column order with one shift (the low halves) and one AND (the high
//!   halves), where columns in order take a zero-extending shuffle (port 5
//!   only) and a shift per sixteen;
//! - fetching: the kernels read all `rank` rows of a block together, so
//!   the tiles go block by block (block `b`'s tile of row `j` is tile
//!   `b · rank + j`) and a matrix is read as one stream front to back
//!   rather than `rank` short rows side by side, which the hardware
//!   prefetcher does not catch before each row ends.
//!
//! The last `cols % 32` columns of every row follow the tiles, row by row
//! in column order. The products and sums are the same in any layout, so
//! the bits are too.

use crate::DType;

/// How the elements of a row are stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Elems {
    F32,
    /// BF16, tiled (see the module's docs): how adapters hold BF16.
    Bf16Tiles,
    /// BF16 rows in column order: a tiled matrix's tail (never a whole
    /// adapter matrix, see [`Elems::of`]).
    Bf16,
}

impl Elems {
    pub(crate) fn of(dtype: DType) -> Option<Elems> {
        match dtype {
            DType::F32 => Some(Elems::F32),
            DType::BF16 => Some(Elems::Bf16Tiles),
            _ => None,
        }
    }
}

/// Columns in a tile.
pub(crate) const TILE: usize = 32;

/// The byte offset, in a tiled BF16 matrix of `rows × cols`, of row `j`'s
/// column `c`.
#[inline]
pub(crate) fn tiled_offset(rows: usize, cols: usize, j: usize, c: usize) -> usize {
    let whole = cols / TILE * TILE;
    if c < whole {
        let (block, i) = (c / TILE, c % TILE);
        64 * (block * rows + j) + 2 * (2 * (i % 16) + i / 16)
    } else {
        tail_start(rows, cols) + 2 * (j * (cols - whole) + c - whole)
    }
}

/// Where the columns past the whole tiles begin, in a tiled matrix.
#[inline]
pub(crate) fn tail_start(rows: usize, cols: usize) -> usize {
    2 * rows * (cols / TILE * TILE)
}

/// A BF16 matrix of `cols` columns (`bytes`, rows in column order) tiled.
pub(crate) fn tile_bf16(bytes: &[u8], cols: usize) -> Vec<u8> {
    let rows = bytes.len().checked_div(2 * cols).unwrap_or(0);
    let mut out = bytes.to_vec();
    for j in 0..rows {
        for c in 0..cols {
            let (from, to) = (2 * (j * cols + c), tiled_offset(rows, cols, j, c));
            out[to..to + 2].copy_from_slice(&bytes[from..from + 2]);
        }
    }
    out
}

/// A tiled BF16 matrix of `cols` columns back in rows of column order.
pub(crate) fn untile_bf16(bytes: &[u8], cols: usize) -> Vec<u8> {
    let rows = bytes.len().checked_div(2 * cols).unwrap_or(0);
    let mut out = bytes.to_vec();
    for j in 0..rows {
        for c in 0..cols {
            let (from, to) = (tiled_offset(rows, cols, j, c), 2 * (j * cols + c));
            out[to..to + 2].copy_from_slice(&bytes[from..from + 2]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiling puts columns `m` and `16 + m` of each row's block in one
    /// word, the rows' tiles of one block side by side, the tail after
    /// them in rows; untiling undoes it.
    #[test]
    fn tiling_is_the_documented_order_and_undoes() {
        for cols in [1usize, 16, 31, 32, 40, 64, 77] {
            for rows in [1usize, 3, 8] {
                let plain: Vec<u8> = (0..rows * cols)
                    .flat_map(|i| u16::try_from(i).expect("small").to_le_bytes())
                    .collect();
                let tiled = tile_bf16(&plain, cols);
                assert_eq!(tiled.len(), plain.len());
                let at = |offset: usize| {
                    usize::from(u16::from_le_bytes([tiled[offset], tiled[offset + 1]]))
                };
                for j in 0..rows {
                    for c in 0..cols {
                        assert_eq!(at(tiled_offset(rows, cols, j, c)), j * cols + c);
                    }
                    // Tile (b, j), word m: columns m (low) and 16 + m (high).
                    for b in 0..cols / TILE {
                        for m in 0..16 {
                            let w = 64 * (b * rows + j) + 4 * m;
                            assert_eq!(at(w), j * cols + TILE * b + m);
                            assert_eq!(at(w + 2), j * cols + TILE * b + 16 + m);
                        }
                    }
                    // The tail: rows in column order after the tiles.
                    let whole = cols / TILE * TILE;
                    for c in whole..cols {
                        let offset = 2 * rows * whole + 2 * (j * (cols - whole) + c - whole);
                        assert_eq!(at(offset), j * cols + c);
                    }
                }
                assert_eq!(untile_bf16(&tiled, cols), plain, "cols {cols} rows {rows}");
            }
        }
    }
}
