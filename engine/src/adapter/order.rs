//! Query and key rows in the base's order.
//!
//! llama.cpp's converter permutes a Llama checkpoint's Q and K rows so
//! that RoPE pairs neighbouring dimensions (`RopeStyle::Interleaved`);
//! Hugging Face files keep each head's halves apart (`Neox`). A LoRA
//! update's output rows are the weight's rows, so `B`'s rows must be in the
//! base's order: a PEFT adapter on a GGUF Llama gets the converter's
//! permutation, a GGUF Llama adapter on a Hugging Face base its inverse.

/// Which order a weight's rows are in within each head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Each head's first half, then its second (Hugging Face).
    Halves,
    /// Each head's pairs side by side (GGUF Llama, after the converter's
    /// `permute`).
    Pairs,
}

/// The position in `to` order of the row at `row` in `from` order, for
/// heads of `head_dim` rows.
fn moved(row: usize, head_dim: usize, from: RowOrder, to: RowOrder) -> usize {
    let (head, within) = (row / head_dim, row % head_dim);
    let half = head_dim / 2;
    let within = match (from, to) {
        // Halves (j, i) → pairs 2i + j, as `permute`'s swapaxes does.
        (RowOrder::Halves, RowOrder::Pairs) => 2 * (within % half) + within / half,
        (RowOrder::Pairs, RowOrder::Halves) => (within % 2) * half + within / 2,
        _ => within,
    };
    head * head_dim + within
}

/// `b_t` (`rank × out`, the expand transposed) with its output columns
/// moved from `from` to `to` order.
pub fn reorder_columns(
    b_t: &[f32],
    out: usize,
    head_dim: usize,
    from: RowOrder,
    to: RowOrder,
) -> Vec<f32> {
    if from == to || head_dim < 2 || out == 0 {
        return b_t.to_vec();
    }
    let mut moved_t = vec![0.0; b_t.len()];
    for (src_row, dst_row) in b_t.chunks(out).zip(moved_t.chunks_mut(out)) {
        for (col, value) in src_row.iter().enumerate() {
            dst_row[moved(col, head_dim, from, to)] = *value;
        }
    }
    moved_t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's `permute` written out as NumPy does it
    /// (`reshape(n_head, 2, d/2).swapaxes(1, 2).reshape(-1)`): the
    /// row that lands at each position.
    fn converter_permute(rows: &[usize], head_dim: usize) -> Vec<usize> {
        let half = head_dim / 2;
        let heads = rows.len() / head_dim;
        let mut out = Vec::new();
        for h in 0..heads {
            for i in 0..half {
                for j in 0..2 {
                    out.push(rows[h * head_dim + j * half + i]);
                }
            }
        }
        out
    }

    #[test]
    fn halves_to_pairs_is_the_converters_permute_and_round_trips() {
        let (head_dim, heads, rank) = (8, 3, 2);
        let out = head_dim * heads;
        // b_t[r][col] = col + 100 r: each value names its source column.
        let b_t: Vec<f32> = (0..rank)
            .flat_map(|r| (0..out).map(move |c| (c + 100 * r) as f32))
            .collect();
        let pairs = reorder_columns(&b_t, out, head_dim, RowOrder::Halves, RowOrder::Pairs);
        let want = converter_permute(&(0..out).collect::<Vec<_>>(), head_dim);
        for r in 0..rank {
            let got: Vec<usize> = pairs[r * out..(r + 1) * out]
                .iter()
                .map(|v| *v as usize - 100 * r)
                .collect();
            assert_eq!(got, want);
        }
        let back = reorder_columns(&pairs, out, head_dim, RowOrder::Pairs, RowOrder::Halves);
        assert_eq!(back, b_t);
    }
}
