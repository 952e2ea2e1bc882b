//! A row's greedy token searched on every pool thread: the row in blocks,
//! one [`Best`] a task, merged in row order (the same id as one search,
//! see [`crate::argmax`]).

use super::disjoint::DisjointSlice;
use super::threads::ThreadPool;
use crate::argmax::{pick, Best};

/// Logits a task searches at least: a row of up to this many (SmolLM2's
/// 49,152) is searched on the caller alone, a job for it measured slower
/// than the search; Gemma 3's 262,144 make four tasks. A block (256 KB)
/// stays in L2 between the search's two passes.
const BLOCK: usize = 64 * 1024;

/// The greedy token of `row`, its blocks searched on `pool`'s threads.
pub(crate) fn argmax(pool: &ThreadPool, row: &[f32]) -> u32 {
    let block = pool.chunk_for(row.len(), 4, BLOCK);
    let blocks = row.len().div_ceil(block);
    let mut bests = vec![None; blocks];
    let out = DisjointSlice::new(&mut bests);
    pool.for_each_range(row.len(), block, &|range| {
        let best = Best::of(&row[range.clone()], range.start);
        // SAFETY: each range is one block, written by its task alone.
        unsafe { out.write(range.start / block, best) };
    });
    pick(row, bests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_search_picks_what_one_search_picks() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            // A vocabulary that is not a multiple of the block, long
            // enough for several blocks on every thread.
            let n = 262_144 + 37;
            let block = pool.chunk_for(n, 4, BLOCK);
            let base: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1013) as f32).collect();
            let top = base.iter().copied().fold(f32::MIN, f32::max);
            let mut cases = vec![("distinct maxima", base.clone())];
            // The maximum in several blocks: the lowest id wins.
            let mut ties = vec![0.0f32; n];
            for at in [n - 1, 3 * block + 3, 2 * block - 1, block + 1] {
                ties[at] = 2.0;
            }
            assert_eq!(argmax(&pool, &ties), (block + 1) as u32);
            cases.push(("ties across blocks", ties));
            let mut last = base.clone();
            last[n - 1] = top + 1.0;
            cases.push(("the last id, in the short block", last));
            let mut nan = base.clone();
            for at in (0..n).step_by(997).skip(1) {
                nan[at] = f32::NAN;
            }
            nan[n / 2] = f32::NAN;
            cases.push(("NaN in every block", nan));
            let mut first = base.clone();
            first[0] = f32::NAN;
            cases.push(("NaN first", first));
            let mut zeros = vec![-1.0f32; n];
            zeros[2 * block + 9] = 0.0;
            zeros[block + 2] = -0.0;
            cases.push(("signed zeros in two blocks", zeros));
            let mut nans = vec![f32::NAN; n];
            nans[0] = f32::NEG_INFINITY;
            cases.push(("-inf first, NaN after", nans));
            for (name, row) in &cases {
                assert_eq!(
                    argmax(&pool, row),
                    crate::argmax::argmax(row),
                    "{name}, {threads} threads"
                );
            }
            for n in [0, 1, 17, 2 * BLOCK - 1, 2 * BLOCK + 1] {
                let row: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
                assert_eq!(
                    argmax(&pool, &row),
                    crate::argmax::argmax(&row),
                    "{n} logits"
                );
            }
        }
    }
}
