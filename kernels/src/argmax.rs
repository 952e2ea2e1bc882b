//! The greedy token of a row of logits: the most likely id, the lowest id
//! on ties. NaN logits never win (a NaN first logit makes 0 the answer, as
//! a scan that starts there would).
//!
//! A row can be searched in blocks ([`Best::of`], one per pool task) and
//! the blocks' answers merged in row order ([`pick`]): the same id as one
//! search of the whole row ([`argmax`]), which is the same code with one
//! block. A block's answer is the largest non-NaN value and the first
//! position holding it, so the merge keeps an earlier block on equal values
//! (`-0.0` and `0.0` included, as `==` has them equal).

/// The largest non-NaN value of a block of a row and the first position
/// (in the row) that holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Best {
    pub value: f32,
    pub at: usize,
}

impl Best {
    /// `block`'s best, `offset` being the block's start in its row; none
    /// when every value is NaN or the block is empty.
    pub fn of(block: &[f32], offset: usize) -> Option<Best> {
        // Two passes over a block that stays in cache: the first keeps
        // sixteen running maxima in one vector register, several times
        // faster than one scalar scan that also tracks the position.
        Best::with_value(block, offset, largest(block))
    }

    /// As [`Best::of`] where the block's [`largest`] value is known.
    pub fn with_value(block: &[f32], offset: usize, value: f32) -> Option<Best> {
        let at = block.iter().position(|&l| l == value)?;
        Some(Best {
            value,
            at: offset + at,
        })
    }
}

/// The largest non-NaN value of `logits` (negative infinity when there is
/// none).
pub fn largest(logits: &[f32]) -> f32 {
    // Sixteen lanes: `f32::max` one value after another is a serial chain.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    (lanes.iter().chain(rest)).fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// The greedy token of `row` from its blocks' bests, given in row order.
pub fn pick(row: &[f32], bests: impl IntoIterator<Item = Option<Best>>) -> u32 {
    match row.first() {
        Some(first) if !first.is_nan() => {}
        _ => return 0,
    }
    bests
        .into_iter()
        .flatten()
        .reduce(|kept, next| if next.value > kept.value { next } else { kept })
        .map_or(0, |best| best.at as u32)
}

/// The greedy token of `logits`, searched as one block.
pub fn argmax(logits: &[f32]) -> u32 {
    pick(logits, [Best::of(logits, 0)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain scan the lane search replaced: the first strictly greater
    /// logit wins, starting from the first.
    fn scan(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    fn rows() -> Vec<(String, Vec<f32>)> {
        let mut rows = Vec::new();
        for n in [0usize, 1, 2, 15, 16, 17, 33, 1000, 4099] {
            // Few distinct values, so ties are common.
            let base: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
            rows.push((format!("n={n}"), base.clone()));
            if n > 3 {
                let mut nan = base.clone();
                nan[n / 2] = f32::NAN;
                nan[n - 1] = f32::NAN;
                rows.push((format!("n={n} with NaN"), nan));
                let mut first = base.clone();
                first[0] = f32::NAN;
                rows.push((format!("n={n} NaN first"), first));
                let mut zeros = vec![-1.0f32; n];
                zeros[n / 3] = -0.0;
                zeros[n / 2] = 0.0;
                rows.push((format!("n={n} signed zeros"), zeros));
                let mut infinite = vec![f32::NEG_INFINITY; n];
                infinite[n - 2] = f32::NAN;
                rows.push((format!("n={n} all -inf"), infinite));
                let mut nans = vec![f32::NAN; n];
                nans[0] = -3.0;
                rows.push((format!("n={n} NaN but the first"), nans));
            }
        }
        rows
    }

    #[test]
    fn argmax_matches_a_plain_scan() {
        for (name, row) in rows() {
            assert_eq!(argmax(&row), scan(&row), "{name}");
        }
    }

    #[test]
    fn blocks_of_any_size_pick_what_one_search_picks() {
        for (name, row) in rows() {
            for block in [1usize, 2, 3, 16, 17, 100, 1024] {
                let bests = row
                    .chunks(block)
                    .enumerate()
                    .map(|(i, part)| Best::of(part, i * block));
                assert_eq!(pick(&row, bests), scan(&row), "{name}, blocks of {block}");
            }
        }
    }
}
