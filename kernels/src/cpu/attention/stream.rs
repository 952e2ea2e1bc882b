//! Attention that streams the KV cache: one task takes a tile of query
//! rows of one sequence and every query head of one KV head (the GQA
//! group), and walks that KV head's keys and values a block at a time with
//! an online softmax (a running maximum `m` and sum `l` per query; when a
//! block raises `m`, the sum and the output so far are rescaled by
//! `e^(m_old − m_new)`). Each block of keys and values is read from the
//! cache once per tile and then served from L1 to all `rows × group`
//! queries; no score row grows with the context; `exp` is vectorised.
//!
//! Blocks start at multiples of [`KEY_BLOCK`] positions, and a row at
//! position `p` stops at `p` (the causal mask) inside its last block, so a
//! row's arithmetic depends only on its own query, its position and the
//! cache: the same in any tile, batch or chunking.

use std::cell::RefCell;

use super::scores::scores16;
use crate::cpu::exp::{exp_scalar, exp_shifted};
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_cache::KEY_TILE;
use crate::cpu::vecmath::{scale_in_place, weighted_sum};

/// Key positions per block: 32 keys and 32 values of 64 f32 are 16 KB,
/// half of L1, leaving room for the queries, scores and outputs. Whole
/// key tiles, so that a block's scores come from whole tiles.
pub(super) const KEY_BLOCK: usize = 2 * KEY_TILE;
/// Query rows per task: with a group of three heads, 24 queries share each
/// block read from the cache.
pub(super) const ROW_TILE: usize = 8;

/// What one task reads: `rows` query rows at positions
/// `first_pos..first_pos + rows`, each row's `group` heads of `head_dim`
/// found by `query(i, h)`, against the key tiles (see `kv_cache`) and the
/// values (`head_dim` floats per position) of positions
/// `0..first_pos + rows`.
pub(super) struct Tile<'a> {
    pub(super) rows: usize,
    pub(super) first_pos: usize,
    pub(super) group: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// Positions a row sees (itself included) in a sliding-window layer.
    pub(super) window: Option<usize>,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub(super) softcap: Option<f32>,
    /// Slots of the cache: position `p` is in slot `p % slots` (a ring in
    /// a windowed layer; otherwise every position is below it).
    pub(super) slots: usize,
    pub(super) keys: &'a [f32],
    pub(super) values: &'a [f32],
}

/// Per-query state of a tile, reused across calls on each thread.
#[derive(Default)]
struct State {
    /// Running maximum and sum per query.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// Unnormalised outputs, `head_dim` per query.
    acc: Vec<f32>,
    scores: Vec<f32>,
}

impl State {
    /// Empty running state for every query of `tile`.
    fn reset(&mut self, tile: &Tile<'_>) {
        let queries = tile.rows * tile.group;
        self.max.clear();
        self.max.resize(queries, f32::NEG_INFINITY);
        self.sum.clear();
        self.sum.resize(queries, 0.0);
        self.acc.clear();
        self.acc.resize(queries * tile.head_dim, 0.0);
        self.scores.resize(KEY_BLOCK, 0.0);
    }

    /// Folds one block into query `qi`: `self.scores[block]` are its scores against
    /// the keys whose values are `values` (online softmax: rescale what came before
    /// when the block raises the running maximum).
    #[inline]
    fn fold(
        &mut self,
        isa: CheckedIsa,
        qi: usize,
        hd: usize,
        block: std::ops::Range<usize>,
        values: &[f32],
    ) {
        let scores = &mut self.scores[block];
        let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
        let acc = &mut self.acc[qi * hd..(qi + 1) * hd];
        let max = &mut self.max[qi];
        if block_max > *max {
            // The first block finds sum and acc zero: nothing to rescale.
            if self.sum[qi] != 0.0 {
                let c = exp_scalar(*max - block_max);
                self.sum[qi] *= c;
                scale_in_place(isa, c, acc);
            }
            *max = block_max;
        }
        self.sum[qi] += exp_shifted(isa, scores, *max);
        weighted_sum(isa, scores, values, acc);
    }

    /// Hands every query's normalised output to `out(row, head, values)`.
    fn finish(
        &mut self,
        isa: CheckedIsa,
        tile: &Tile<'_>,
        out: &mut impl FnMut(usize, usize, &[f32]),
    ) {
        let hd = tile.head_dim;
        for i in 0..tile.rows {
            for h in 0..tile.group {
                let qi = i * tile.group + h;
                let acc = &mut self.acc[qi * hd..(qi + 1) * hd];
                scale_in_place(isa, 1.0 / self.sum[qi], acc);
                out(i, h, acc);
            }
        }
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `tile`; `query(i, h)` is row `i`'s head `h` (of the group) and
/// `out(i, h, values)` receives its normalised output.
pub(super) fn attend_tile<'q>(
    isa: CheckedIsa,
    tile: &Tile<'_>,
    query: impl Fn(usize, usize) -> &'q [f32],
    mut out: impl FnMut(usize, usize, &[f32]),
) {
    let general = tile.window.is_some() || tile.softcap.is_some();
    STATE.with(|state| match state.try_borrow_mut() {
        Ok(mut state) if general => run_general(isa, tile, &query, &mut out, &mut state),
        Ok(mut state) => run(isa, tile, &query, &mut out, &mut state),
        // Only a nested call on this thread gets here.
        Err(_) if general => run_general(isa, tile, &query, &mut out, &mut State::default()),
        Err(_) => run(isa, tile, &query, &mut out, &mut State::default()),
    });
}

/// [`run`] for a layer with a sliding window or capped scores: a row at
/// position `p` sees positions `p + 1 - window ..= p`, read from their
/// slots. Blocks start at multiples of [`KEY_BLOCK`] positions and map to
/// one run of slots each (the ring is a multiple of the block); a row
/// visits the blocks that meet its range, in position order, so its
/// arithmetic depends only on its query, position and the cache, as in
/// [`run`].
fn run_general<'q>(
    isa: CheckedIsa,
    tile: &Tile<'_>,
    query: &impl Fn(usize, usize) -> &'q [f32],
    out: &mut impl FnMut(usize, usize, &[f32]),
    state: &mut State,
) {
    let hd = tile.head_dim;
    state.reset(tile);
    let first_seen = |p: usize| tile.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let seen_last = tile.first_pos + tile.rows;
    let slots = tile.slots.max(1);
    let mut block = first_seen(tile.first_pos) / KEY_BLOCK * KEY_BLOCK;
    while block < seen_last {
        let slot = block % slots;
        for i in 0..tile.rows {
            let p = tile.first_pos + i;
            // The row's part of this block: positions `lo..end`.
            let (lo, end) = (first_seen(p).max(block), (block + KEY_BLOCK).min(p + 1));
            if lo >= end {
                continue;
            }
            let tiles_end = slot + (end - block);
            let values = &tile.values[(slot + lo - block) * hd..tiles_end * hd];
            for h in 0..tile.group {
                let qi = i * tile.group + h;
                let q = query(i, h);
                let scores = &mut state.scores[..end - block];
                for (t, scores) in scores.chunks_mut(KEY_TILE).enumerate() {
                    let at = (slot + t * KEY_TILE) * hd;
                    let mut all = [0.0; KEY_TILE];
                    scores16(
                        isa,
                        q,
                        &tile.keys[at..at + KEY_TILE * hd],
                        tile.scale,
                        &mut all,
                    );
                    scores.copy_from_slice(&all[..scores.len()]);
                }
                if let Some(cap) = tile.softcap {
                    for s in &mut scores[lo - block..] {
                        *s = cap * (*s / cap).tanh();
                    }
                }
                state.fold(isa, qi, hd, lo - block..end - block, values);
            }
        }
        block += KEY_BLOCK;
    }
    state.finish(isa, tile, out);
}

fn run<'q>(
    isa: CheckedIsa,
    tile: &Tile<'_>,
    query: &impl Fn(usize, usize) -> &'q [f32],
    out: &mut impl FnMut(usize, usize, &[f32]),
    state: &mut State,
) {
    let hd = tile.head_dim;
    state.reset(tile);
    let seen_last = tile.first_pos + tile.rows;
    let mut block = 0;
    while block < seen_last {
        for i in 0..tile.rows {
            // Positions this row sees in this block (causal mask).
            let seen = tile.first_pos + i + 1;
            if block >= seen {
                continue;
            }
            let end = (block + KEY_BLOCK).min(seen);
            let values = &tile.values[block * hd..end * hd];
            for h in 0..tile.group {
                let qi = i * tile.group + h;
                let q = query(i, h);
                let scores = &mut state.scores[..end - block];
                for (t, scores) in scores.chunks_mut(KEY_TILE).enumerate() {
                    let at = (block + t * KEY_TILE) * hd;
                    let mut all = [0.0; KEY_TILE];
                    scores16(
                        isa,
                        q,
                        &tile.keys[at..at + KEY_TILE * hd],
                        tile.scale,
                        &mut all,
                    );
                    // Lanes past the row's last position are dropped here.
                    scores.copy_from_slice(&all[..scores.len()]);
                }
                state.fold(isa, qi, hd, 0..end - block, values);
            }
        }
        block += KEY_BLOCK;
    }
    state.finish(isa, tile, out);
}
