//! Attention that streams the KV cache: one task takes a tile of query
//! rows of one sequence and every query head of one KV head (the GQA
//! group), and walks that KV head's key blocks (see `kv_store`) one at a time
//! with an online softmax (a running maximum `m` and sum `l` per query;
//! when a block raises `m`, the sum and the output so far are rescaled by
//! `e^(m_old − m_new)`). Each block is read from the cache once per tile,
//! widened to f32 when stored narrower (`kv_elem`), and then served from L1
//! to all `rows × group` queries; no score row grows with the context;
//! `exp` is vectorised.
//!
//! Key blocks start at multiples of [`KEY_BLOCK`] positions, and a row at
//! position `p` stops at `p` (the causal mask) inside its last block. The
//! walk starts a fresh state at every segment boundary and merges the
//! segments in order (see `partial`), so a row's arithmetic depends only on
//! its own query, its position and the cache: the same in any tile, batch,
//! chunking or split of the segments across tasks.
//!
//! A block that every row of a tile of several rows sees whole (all but the
//! last one or two of a prompt's tile) is folded into all the tile's queries
//! at once by the `blocked` kernels, which share each key and value load
//! among many queries; their results are the per-row kernels' bits. A
//! prompt's tile on AMX (BF16 products, `blocked::for_rows`) takes its own
//! walk ([`run_amx`]): every block it reads in spans at fixed positions
//! (`blocked_span`), the positions a row does not see weighed 0 outside
//! its softmax; within the BF16 tolerance of the per-row kernels, not
//! their bits, and again the same in any tile or chunk.

use std::cell::RefCell;

use std::ops::Range;

use super::bf16::{self, Bf16Isa, Products};
use super::bf16x3;
use super::blocked;
use super::blocked_span::{self, FoldScratch, Span};
use super::decode::{self, RowState};
use super::online::online_step;
use super::partial::{merge, normalize};
use super::scores::{scores16_group, scores32_group, GROUP_MAX};
use super::span_pack::Widened;
use super::span_share::SharedBlocks;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::KvElem;
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};
use crate::cpu::prefetch::prefetch_all;
use crate::cpu::vecmath::{scale_in_place, weighted_sum_group};

/// Query rows per task: with a group of three heads, 24 queries share each
/// block read from the cache.
pub(super) const ROW_TILE: usize = 8;

/// What one task reads: `rows` query rows at positions
/// `first_pos..first_pos + rows`, each row's `group` heads of `head_dim`
/// found by `query(i, h)`, against one KV head's run of each key block of
/// the cache (key block `b`'s run, two key tiles then the values, is
/// `runs[b - first_run]`) for the positions of `segments` up to
/// `first_pos + rows`.
pub(super) struct Tile<'a, E> {
    /// f32 products, or BF16 ones (see `bf16`).
    pub(super) products: Products,
    pub(super) rows: usize,
    pub(super) first_pos: usize,
    pub(super) group: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// Positions a row sees (itself included) in a sliding-window layer.
    pub(super) window: Option<usize>,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub(super) softcap: Option<f32>,
    /// Key blocks of the layer: position `p` is in key block
    /// `(p / KEY_BLOCK) % ring` (a ring in a windowed layer; otherwise
    /// every key block is below it).
    pub(super) ring: usize,
    /// Key blocks per block of the cache (one allocation).
    pub(super) key_blocks: usize,
    pub(super) runs: &'a [&'a [E]],
    /// The key block (of the ring) `runs[0]` is: a task is handed only the
    /// key blocks it reads.
    pub(super) first_run: usize,
    /// Positions per segment in this layer (`partial::segment_len`).
    pub(super) segment: usize,
    /// The segments this task reads (see `partial`): every one the rows
    /// see, or one of them when a deep context is split across tasks.
    pub(super) segments: Range<usize>,
    /// The KV head's blocks packed once for every tile of the call, where
    /// they are (`span_share`; AMX walks only).
    pub(super) shared: Option<SharedBlocks<'a>>,
}

impl<E> Tile<'_, E> {
    /// Positions `start..end` to walk, in whole blocks from `start`: the
    /// tile's segments, from `first` (the first block any row sees) to the
    /// last row's position.
    fn span(&self, first: usize) -> (usize, usize) {
        let start = (self.segments.start * self.segment).max(first);
        let end = (self.segments.end * self.segment).min(self.first_pos + self.rows);
        (start, end)
    }
}

impl<E: KvElem> Tile<'_, E> {
    /// Asks for the key block starting at position `block` (see
    /// `prefetch`) while the one before it is computed, when it opens a
    /// block of the cache: blocks are separate allocations, where the
    /// hardware prefetchers start over. Inside one, a head's key blocks
    /// follow each other and the prefetchers keep up; asking for every
    /// line there too made decode at 4k 20% slower (its prefetches crowd
    /// out the stream's).
    fn prefetch(&self, block: usize) {
        if !(block / KEY_BLOCK).is_multiple_of(self.key_blocks.max(1)) {
            return;
        }
        let at = ((block / KEY_BLOCK) % self.ring.max(1)).checked_sub(self.first_run);
        if let Some(run) = at.and_then(|at| self.runs.get(at)) {
            prefetch_all(run);
        }
    }

    /// The keys (two tiles) and values of the key block starting at position
    /// `block`, as f32.
    fn block<'s>(
        &'s self,
        isa: CheckedIsa,
        block: usize,
        scratch: &'s mut Vec<f32>,
    ) -> (&'s [f32], &'s [f32]) {
        let kv = E::widen(isa, self.run(block), scratch);
        kv.split_at(KEY_BLOCK * self.head_dim)
    }

    /// The run of the key block starting at position `block`, as stored.
    fn run(&self, block: usize) -> &[E] {
        self.runs[(block / KEY_BLOCK) % self.ring.max(1) - self.first_run]
    }

    /// Whether a block is folded by the `decode` kernel (which reads the
    /// run in place) rather than widened and folded here: a decode step's
    /// tile (one row) with f32 products and no softcap.
    fn direct(&self, isa: CheckedIsa) -> bool {
        self.rows == 1
            && matches!(self.products, Products::F32)
            && self.softcap.is_none()
            && decode::fast(isa, self.head_dim)
    }
}

/// Per-query state of a tile, reused across calls on each thread.
#[derive(Default)]
struct State {
    /// Running maximum and sum per query.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// Unnormalised outputs, `head_dim` per query.
    acc: Vec<f32>,
    /// The segments before the current one, merged: the same per query.
    total_max: Vec<f32>,
    total_sum: Vec<f32>,
    total_acc: Vec<f32>,
    scores: Vec<f32>,
    /// The block being read, widened to f32 (narrower caches only).
    widened: Vec<f32>,
    /// BF16 products only: the tile's queries, the block's keys (both
    /// tiles) and values, and a group's probabilities, in pairs (`bf16`).
    q_pairs: Vec<u32>,
    k_pairs: Vec<u32>,
    v_pairs: Vec<u32>,
    p_pairs: Vec<u32>,
    /// Blocked products only (`blocked`): the tile's queries chain-major
    /// (f32 or BF16 pairs), every query's scores of a block, the score
    /// chains before they are summed.
    q_chains: Vec<f32>,
    q_chain_pairs: Vec<u32>,
    all: Vec<f32>,
    part: Vec<f32>,
    /// AMX only: the blocks of a span, packed (`blocked_span`), with the
    /// buffers its packing widens into, and the scratch of a fold of
    /// shared blocks (`span_share`).
    span: Span,
    packing: Widened,
    fold: FoldScratch,
}

/// The values [`State::fold`] weighs: a block's f32 rows (from the first
/// position folded), or, for BF16 products, the pairs `State::pack_block`
/// left in the state.
enum Values<'a> {
    F32(&'a [f32]),
    Bf16(Bf16Isa),
}

impl State {
    /// Empty running state for every query of `tile`.
    fn reset<E>(&mut self, tile: &Tile<'_, E>) {
        let queries = tile.rows * tile.group;
        self.max.clear();
        self.max.resize(queries, f32::NEG_INFINITY);
        self.sum.clear();
        self.sum.resize(queries, 0.0);
        self.acc.clear();
        self.acc.resize(queries * tile.head_dim, 0.0);
        self.total_max.clone_from(&self.max);
        self.total_sum.clone_from(&self.sum);
        self.total_acc.clone_from(&self.acc);
        self.scores.resize(GROUP_MAX * KEY_BLOCK, 0.0);
    }

    /// Every query of `tile` in pairs, `head_dim.div_ceil(2)` from
    /// `qi · pairs` (query `qi = row · group + head`); with `split`
    /// (`bf16x3`, an even `head_dim`), three times as many.
    fn pack_queries<'q, E>(
        &mut self,
        isa: Bf16Isa,
        split: bool,
        tile: &Tile<'_, E>,
        query: &impl Fn(usize, usize) -> &'q [f32],
    ) {
        let terms = if split { bf16x3::TERMS } else { 1 };
        let pairs = terms * tile.head_dim.div_ceil(2);
        self.q_pairs.resize(tile.rows * tile.group * pairs, 0);
        for i in 0..tile.rows {
            for h in 0..tile.group {
                let qi = i * tile.group + h;
                let to = &mut self.q_pairs[qi * pairs..(qi + 1) * pairs];
                if split {
                    bf16x3::pack_query(isa, query(i, h), to);
                } else {
                    bf16::pack_in_order(isa, query(i, h), to);
                }
            }
        }
    }

    /// Packs the tile's queries for [`State::fold_all`] (after
    /// [`State::pack_queries`] for BF16 products).
    fn pack_chains<'q, E>(
        &mut self,
        tile: &Tile<'_, E>,
        query: &impl Fn(usize, usize) -> &'q [f32],
    ) {
        let (n, g) = (tile.rows * tile.group, tile.group);
        match tile.products {
            Products::F32 => {
                let q = |qi: usize| query(qi / g, qi % g);
                blocked::pack_f32(q, n, tile.head_dim, &mut self.q_chains);
            }
            Products::Bf16(_) => {
                let pairs = tile.head_dim.div_ceil(2);
                blocked::pack_bf16(&self.q_pairs, n, pairs, &mut self.q_chain_pairs);
            }
        }
    }

    /// Folds a block that every query of the tile sees whole (`keys` and
    /// `values` as `Tile::block` gives them; for BF16 products, packed by
    /// [`State::pack_block`]) into all of them at once: per query the
    /// operations of [`State::fold`], the products from `blocked`.
    fn fold_all<E>(&mut self, isa: CheckedIsa, tile: &Tile<'_, E>, keys: &[f32], values: &[f32]) {
        const PAIRS: usize = KEY_BLOCK / 2;
        let (n, hd) = (tile.rows * tile.group, tile.head_dim);
        let mut all = std::mem::take(&mut self.all);
        all.resize(n * KEY_BLOCK, 0.0);
        match tile.products {
            Products::F32 => {
                let qc = &self.q_chains;
                blocked::scores_f32(isa, qc, (n, hd), keys, tile.scale, &mut self.part, &mut all);
            }
            Products::Bf16(b) => {
                let (qb, kp) = (&self.q_chain_pairs, &self.k_pairs);
                let shape = (n, hd.div_ceil(2));
                blocked::scores_bf16(b, qb, shape, kp, tile.scale, &mut self.part, &mut all);
            }
        }
        for (qi, scores) in all.chunks_exact_mut(KEY_BLOCK).enumerate() {
            if let Some(cap) = tile.softcap {
                for s in scores.iter_mut() {
                    *s = cap * (*s / cap).tanh();
                }
            }
            if let Some(c) = online_step(isa, scores, &mut self.max[qi], &mut self.sum[qi]) {
                scale_in_place(isa, c, &mut self.acc[qi * hd..(qi + 1) * hd]);
            }
        }
        match tile.products {
            Products::F32 => blocked::weighted_f32(isa, &all, (n, hd), values, &mut self.acc),
            Products::Bf16(b) => {
                self.p_pairs.resize(n * PAIRS, 0);
                for (p, to) in all
                    .chunks_exact(KEY_BLOCK)
                    .zip(self.p_pairs.chunks_exact_mut(PAIRS))
                {
                    bf16::pack_in_order(b, p, to);
                }
                blocked::weighted_bf16(b, &self.p_pairs, (n, hd), &self.v_pairs, &mut self.acc);
            }
        }
        self.all = all;
    }

    /// A block's keys and its first `valid` values in pairs (the rest of
    /// the pairs are left as they were and never read: a row's weights
    /// past its last position are 0, and so is a value of a missing
    /// position in a pair that is read).
    fn pack_block(&mut self, isa: Bf16Isa, hd: usize, keys: &[f32], values: &[f32], valid: usize) {
        let pairs = hd.div_ceil(2);
        self.k_pairs.resize(2 * pairs * KEY_TILE, 0);
        for t in 0..valid.div_ceil(KEY_TILE).min(2) {
            let tile = &keys[t * KEY_TILE * hd..(t + 1) * KEY_TILE * hd];
            let to = &mut self.k_pairs[t * pairs * KEY_TILE..(t + 1) * pairs * KEY_TILE];
            bf16::pack_key_tile(isa, tile, hd, to);
        }
        self.v_pairs.resize(KEY_BLOCK / 2 * hd, 0);
        let row = |j: usize| -> &[f32] {
            if j < valid {
                &values[j * hd..(j + 1) * hd]
            } else {
                &[]
            }
        };
        for m in 0..valid.div_ceil(2).min(KEY_BLOCK / 2) {
            bf16::pack(
                isa,
                row(2 * m),
                row(2 * m + 1),
                &mut self.v_pairs[m * hd..(m + 1) * hd],
            );
        }
    }

    /// Folds positions `lanes` of the key block at `block` into the
    /// tile's one row by the `decode` kernel; `false`, with nothing
    /// changed, where it does not take them (see `decode::fold_row`).
    fn fold_direct<'q, E: KvElem>(
        &mut self,
        isa: CheckedIsa,
        tile: &Tile<'_, E>,
        query: &impl Fn(usize, usize) -> &'q [f32],
        block: usize,
        lanes: Range<usize>,
    ) -> bool {
        let Some(run) = E::direct(tile.run(block)) else {
            return false;
        };
        let hd = tile.head_dim;
        // The heads `GROUP_MAX` at a time, as `fold`: the same states.
        for h0 in (0..tile.group).step_by(GROUP_MAX) {
            let g = (tile.group - h0).min(GROUP_MAX);
            let qs: [&[f32]; GROUP_MAX] = std::array::from_fn(|h| query(0, h0 + h.min(g - 1)));
            let state = RowState {
                max: &mut self.max[h0..h0 + g],
                sum: &mut self.sum[h0..h0 + g],
                acc: &mut self.acc[h0 * hd..(h0 + g) * hd],
            };
            // The first pass fails or none does (the same lengths).
            if !decode::fold_row(isa, run, &qs[..g], tile.scale, lanes.clone(), state) {
                return false;
            }
        }
        true
    }

    /// Ends a segment: merges each query's state into its total and
    /// starts the next segment from an empty state.
    fn close_segment(&mut self, isa: CheckedIsa, hd: usize) {
        for qi in 0..self.max.len() {
            let acc = &mut self.acc[qi * hd..(qi + 1) * hd];
            merge(
                isa,
                (
                    &mut self.total_max[qi],
                    &mut self.total_sum[qi],
                    &mut self.total_acc[qi * hd..(qi + 1) * hd],
                ),
                (self.max[qi], self.sum[qi], acc),
            );
            self.max[qi] = f32::NEG_INFINITY;
            self.sum[qi] = 0.0;
            acc.fill(0.0);
        }
    }

    /// Folds one block into the `g` queries from `qi`: query `qi + h`'s
    /// scores are `self.scores[h · KEY_BLOCK + block]`, against the keys
    /// whose values are `values` (online softmax: rescale what came before
    /// when the block raises the running maximum). The value rows are read
    /// once for the whole group (`weighted_sum_group`).
    #[inline]
    fn fold(
        &mut self,
        isa: CheckedIsa,
        (qi, g): (usize, usize),
        hd: usize,
        block: std::ops::Range<usize>,
        values: Values<'_>,
    ) {
        for h in 0..g {
            let (q, at) = (qi + h, h * KEY_BLOCK);
            let scores = &mut self.scores[at + block.start..at + block.end];
            if let Some(c) = online_step(isa, scores, &mut self.max[q], &mut self.sum[q]) {
                scale_in_place(isa, c, &mut self.acc[q * hd..(q + 1) * hd]);
            }
        }
        let values = match values {
            Values::F32(values) => values,
            Values::Bf16(b) => return self.fold_bf16(b, (qi, g), hd, block),
        };
        let ps: [&[f32]; GROUP_MAX] = std::array::from_fn(|h| {
            let at = h.min(g - 1) * KEY_BLOCK;
            &self.scores[at + block.start..at + block.end]
        });
        let acc = &mut self.acc[qi * hd..(qi + g) * hd];
        weighted_sum_group(isa, &ps[..g], values, acc);
    }

    /// The weighted sum of [`State::fold`] in BF16: each query's
    /// probabilities of `block` (0 outside it) in pairs against the
    /// block's value pairs that meet it.
    fn fold_bf16(
        &mut self,
        b: Bf16Isa,
        (qi, g): (usize, usize),
        hd: usize,
        block: std::ops::Range<usize>,
    ) {
        const PAIRS: usize = KEY_BLOCK / 2;
        self.p_pairs.resize(GROUP_MAX * PAIRS, 0);
        for h in 0..g {
            let at = h * KEY_BLOCK;
            let mut p = [0.0f32; KEY_BLOCK];
            p[block.clone()].copy_from_slice(&self.scores[at + block.start..at + block.end]);
            bf16::pack_in_order(b, &p, &mut self.p_pairs[h * PAIRS..(h + 1) * PAIRS]);
        }
        let (m0, m1) = (block.start / 2, block.end.div_ceil(2));
        let ps: [&[u32]; GROUP_MAX] = std::array::from_fn(|h| {
            let at = h.min(g - 1) * PAIRS;
            &self.p_pairs[at + m0..at + m1]
        });
        let acc = &mut self.acc[qi * hd..(qi + g) * hd];
        bf16::weighted_sum(b, &ps[..g], &self.v_pairs[m0 * hd..m1 * hd], acc);
    }

    /// Closes the last segment and hands every query's merged state to
    /// `out(row, head, max, sum, acc)`.
    fn finish<E>(&mut self, isa: CheckedIsa, tile: &Tile<'_, E>, out: &mut impl FnMut(Merged<'_>)) {
        let hd = tile.head_dim;
        self.close_segment(isa, hd);
        for i in 0..tile.rows {
            for h in 0..tile.group {
                let qi = i * tile.group + h;
                out(Merged {
                    row: i,
                    head: h,
                    max: self.total_max[qi],
                    sum: self.total_sum[qi],
                    acc: &mut self.total_acc[qi * hd..(qi + 1) * hd],
                });
            }
        }
    }
}

/// What a tile hands back per query: its state over the tile's segments.
pub(super) struct Merged<'a> {
    pub(super) row: usize,
    pub(super) head: usize,
    pub(super) max: f32,
    pub(super) sum: f32,
    pub(super) acc: &'a mut [f32],
}

impl<'a> Merged<'a> {
    /// The attention output (the state normalised, in place).
    pub(super) fn output(self, isa: CheckedIsa) -> (usize, usize, &'a [f32]) {
        normalize(isa, self.sum, self.acc);
        (self.row, self.head, self.acc)
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `tile`; `query(i, h)` is row `i`'s head `h` (of the group) and
/// `out` receives each query's state over the tile's segments.
pub(super) fn attend_tile<'q, E: KvElem>(
    isa: CheckedIsa,
    tile: &Tile<'_, E>,
    query: impl Fn(usize, usize) -> &'q [f32],
    mut out: impl FnMut(Merged<'_>),
) {
    let general = tile.window.is_some() || tile.softcap.is_some();
    let amx = match tile.products {
        Products::Bf16(b) if blocked_span::takes(b, tile.head_dim) => Some(b),
        _ => None,
    };
    STATE.with(|state| {
        let mut borrowed = state.try_borrow_mut();
        // Only a nested call on this thread finds the state borrowed.
        let mut fresh = State::default();
        let state: &mut State = match &mut borrowed {
            Ok(state) => state,
            Err(_) => &mut fresh,
        };
        match amx {
            Some(b) => run_amx(isa, tile, &query, &mut out, state, b),
            None if general => run_general(isa, tile, &query, &mut out, state),
            None => run(isa, tile, &query, &mut out, state),
        }
    });
}

/// [`run`] for a layer with a sliding window or capped scores: a row at
/// position `p` sees positions `p + 1 - window ..= p`, read from their
/// blocks of the ring. A row visits the blocks that meet its range, in
/// position order, so its arithmetic depends only on its query, position
/// and the cache, as in [`run`].
fn run_general<'q, E: KvElem>(
    isa: CheckedIsa,
    tile: &Tile<'_, E>,
    query: &impl Fn(usize, usize) -> &'q [f32],
    out: &mut impl FnMut(Merged<'_>),
    state: &mut State,
) {
    let hd = tile.head_dim;
    state.reset(tile);
    let mut scratch = std::mem::take(&mut state.widened);
    let first_seen = |p: usize| tile.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let (start, end) = tile.span(first_seen(tile.first_pos) / KEY_BLOCK * KEY_BLOCK);
    if let Products::Bf16(b) = tile.products {
        state.pack_queries(b, false, tile, query);
    }
    let blocked = blocked_tile(isa, tile);
    if blocked {
        state.pack_chains(tile, query);
    }
    let direct = tile.direct(isa);
    // Blocks from here on every row sees whole: after the first row's
    // position and inside the last row's window.
    let whole = |block: usize| {
        block + KEY_BLOCK <= tile.first_pos + 1
            && first_seen(tile.first_pos + tile.rows - 1) <= block
    };
    let mut block = start;
    while block < end {
        if block > start && block.is_multiple_of(tile.segment) {
            state.close_segment(isa, hd);
        }
        if block + KEY_BLOCK < end {
            tile.prefetch(block + KEY_BLOCK);
        }
        if direct {
            // The row's part of this block, as below (one row).
            let p = tile.first_pos;
            let (lo, hi) = (first_seen(p).max(block), (block + KEY_BLOCK).min(p + 1));
            let lanes = lo.saturating_sub(block)..hi.saturating_sub(block);
            if lanes.is_empty() || state.fold_direct(isa, tile, query, block, lanes) {
                block += KEY_BLOCK;
                continue;
            }
        }
        let (keys, values) = tile.block(isa, block, &mut scratch);
        if let Products::Bf16(b) = tile.products {
            state.pack_block(b, hd, keys, values, (end - block).min(KEY_BLOCK));
        }
        if blocked && whole(block) {
            state.fold_all(isa, tile, keys, values);
            block += KEY_BLOCK;
            continue;
        }
        for i in 0..tile.rows {
            let p = tile.first_pos + i;
            // The row's part of this block: positions `lo..end`.
            let (lo, end) = (first_seen(p).max(block), (block + KEY_BLOCK).min(p + 1));
            if lo >= end {
                continue;
            }
            let values = &values[(lo - block) * hd..(end - block) * hd];
            for h0 in (0..tile.group).step_by(GROUP_MAX) {
                let g = (tile.group - h0).min(GROUP_MAX);
                let n = end - block;
                let qi = i * tile.group + h0;
                match tile.products {
                    Products::F32 => {
                        block_scores(isa, &|h| query(i, h0 + h), g, keys, tile.scale, n, state)
                    }
                    Products::Bf16(b) => block_scores_bf16(b, qi, g, hd, tile.scale, state),
                }
                if let Some(cap) = tile.softcap {
                    for h in 0..g {
                        let at = h * KEY_BLOCK;
                        for s in &mut state.scores[at + lo - block..at + n] {
                            *s = cap * (*s / cap).tanh();
                        }
                    }
                }
                let values = match tile.products {
                    Products::F32 => Values::F32(values),
                    Products::Bf16(b) => Values::Bf16(b),
                };
                state.fold(isa, (qi, g), hd, lo - block..n, values);
            }
        }
        block += KEY_BLOCK;
    }
    state.widened = scratch;
    state.finish(isa, tile, out);
}

fn run<'q, E: KvElem>(
    isa: CheckedIsa,
    tile: &Tile<'_, E>,
    query: &impl Fn(usize, usize) -> &'q [f32],
    out: &mut impl FnMut(Merged<'_>),
    state: &mut State,
) {
    let hd = tile.head_dim;
    state.reset(tile);
    let mut scratch = std::mem::take(&mut state.widened);
    let (start, end) = tile.span(0);
    if let Products::Bf16(b) = tile.products {
        state.pack_queries(b, false, tile, query);
    }
    let blocked = blocked_tile(isa, tile);
    if blocked {
        state.pack_chains(tile, query);
    }
    let direct = tile.direct(isa);
    let mut block = start;
    while block < end {
        if block > start && block.is_multiple_of(tile.segment) {
            state.close_segment(isa, hd);
        }
        if block + KEY_BLOCK < end {
            tile.prefetch(block + KEY_BLOCK);
        }
        // One row (a decode step) sees the block up to its position.
        let lanes = 0..(block + KEY_BLOCK).min(tile.first_pos + 1) - block;
        if direct && state.fold_direct(isa, tile, query, block, lanes) {
            block += KEY_BLOCK;
            continue;
        }
        let (keys, values) = tile.block(isa, block, &mut scratch);
        if let Products::Bf16(b) = tile.products {
            state.pack_block(b, hd, keys, values, (end - block).min(KEY_BLOCK));
        }
        // Every row sees the whole block (past the first row's position).
        if blocked && block + KEY_BLOCK <= tile.first_pos + 1 {
            state.fold_all(isa, tile, keys, values);
            block += KEY_BLOCK;
            continue;
        }
        for i in 0..tile.rows {
            // Positions this row sees in this block (causal mask).
            let seen = tile.first_pos + i + 1;
            if block >= seen {
                continue;
            }
            let end = (block + KEY_BLOCK).min(seen);
            let values = &values[..(end - block) * hd];
            for h0 in (0..tile.group).step_by(GROUP_MAX) {
                let g = (tile.group - h0).min(GROUP_MAX);
                let n = end - block;
                let qi = i * tile.group + h0;
                let values = match tile.products {
                    Products::F32 => {
                        block_scores(isa, &|h| query(i, h0 + h), g, keys, tile.scale, n, state);
                        Values::F32(values)
                    }
                    Products::Bf16(b) => {
                        block_scores_bf16(b, qi, g, hd, tile.scale, state);
                        Values::Bf16(b)
                    }
                };
                state.fold(isa, (qi, g), hd, 0..n, values);
            }
        }
        block += KEY_BLOCK;
    }
    state.widened = scratch;
    state.finish(isa, tile, out);
}

/// A prompt's tile on AMX (`blocked::for_rows`), in a layer with or
/// without a window: every block its rows read, seen whole or in part,
/// folded into all its queries (padded to whole AMX tiles) in spans cut
/// at fixed positions (`blocked_span::stop`), a row's lanes outside
/// `first_seen(p)..=p` weighed 0 outside its softmax. So a row's
/// arithmetic depends only on its query, position and the cache, as in
/// [`run`]: a prompt gives the same bits fed whole, in chunks of any
/// length, or as a cached prefix and its tail. A span's blocks come from
/// the call's shared packing where it holds them as this tile would pack
/// them (`span_share`), else are packed here.
fn run_amx<'q, E: KvElem>(
    isa: CheckedIsa,
    tile: &Tile<'_, E>,
    query: &impl Fn(usize, usize) -> &'q [f32],
    out: &mut impl FnMut(Merged<'_>),
    state: &mut State,
    b: Bf16Isa,
) {
    let hd = tile.head_dim;
    let n = tile.rows * tile.group;
    let padded = n.next_multiple_of(blocked_span::QUERY_ROWS);
    state.reset(tile);
    state.acc.resize(padded * hd, 0.0);
    // Split operands (`bf16x3`) take `terms` times the pairs.
    state.pack_queries(b, b.split(), tile, query);
    state
        .q_pairs
        .resize(padded * bf16x3::terms(b) * hd.div_ceil(2), 0);
    let first_seen = |p: usize| tile.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let (start, end) = tile.span(first_seen(tile.first_pos) / KEY_BLOCK * KEY_BLOCK);
    let mut at = start;
    while at < end {
        if at > start && at.is_multiple_of(tile.segment) {
            state.close_segment(isa, hd);
        }
        let stop = blocked_span::stop(at, end, tile.segment);
        // The lanes of the span that query `qi`'s row sees.
        let seen = |qi: usize| {
            let p = tile.first_pos + qi / tile.group;
            let (lo, hi) = (first_seen(p).max(at), (p + 1).min(stop));
            if hi > lo {
                lo - at..hi - at
            } else {
                0..0
            }
        };
        let queries = blocked_span::SpanQueries {
            q: &state.q_pairs,
            n,
            head_dim: hd,
            scale: tile.scale,
            softcap: tile.softcap,
        };
        let (max, sum, acc) = (&mut state.max, &mut state.sum, &mut state.acc);
        let shared = tile
            .shared
            .and_then(|s| s.span(at / KEY_BLOCK, stop / KEY_BLOCK, end));
        if let Some(blocks) = shared {
            state
                .fold
                .fold(isa, b, blocks, &queries, seen, (max, sum, acc));
        } else {
            state.span.clear();
            for block in (at..stop).step_by(KEY_BLOCK) {
                if block + KEY_BLOCK < end {
                    tile.prefetch(block + KEY_BLOCK);
                }
                let run = (tile.run(block), end - block);
                state.span.push_run(isa, (b, hd), run, &mut state.packing);
            }
            state.span.fold(isa, b, &queries, seen, (max, sum, acc));
        }
        at = stop;
    }
    state.finish(isa, tile, out);
}

/// Whether `tile` folds whole blocks into all its queries at once
/// (`blocked`): a prompt's tile of several rows, where those kernels run
/// fast. A decode step's tile (one row) keeps the per-row kernels, whose
/// results are the same.
fn blocked_tile<E>(isa: CheckedIsa, tile: &Tile<'_, E>) -> bool {
    let bf16 = match tile.products {
        Products::F32 => None,
        Products::Bf16(b) => Some(b),
    };
    tile.rows > 1 && blocked::fast(isa, bf16)
}

/// `state.scores[h · KEY_BLOCK + j] = scale · (q_h · key_j)` for the `g`
/// queries `query(h)` and the first `n` keys of a block's two key tiles;
/// the queries share each key row read (`scores16_group`), and lanes past
/// `n` are computed and left in place, unread.
#[inline]
fn block_scores<'q>(
    isa: CheckedIsa,
    query: &impl Fn(usize) -> &'q [f32],
    g: usize,
    keys: &[f32],
    scale: f32,
    n: usize,
    state: &mut State,
) {
    let qs: [&[f32]; GROUP_MAX] = std::array::from_fn(|h| query(h.min(g - 1)));
    let hd = qs[0].len();
    // Query h's scores are row h of `state.scores`: written in place.
    let (rows, _) = state.scores.as_chunks_mut::<KEY_BLOCK>();
    if n > KEY_TILE && scores32_group(isa, &qs[..g], keys, scale, rows) {
        return;
    }
    let mut all = [[0.0; KEY_TILE]; GROUP_MAX];
    for t in 0..n.div_ceil(KEY_TILE) {
        let at = t * KEY_TILE * hd;
        scores16_group(
            isa,
            &qs[..g],
            &keys[at..at + KEY_TILE * hd],
            scale,
            &mut all,
        );
        // Whole tiles, lanes past `n` included (read by no one): a copy of
        // a constant length is one vector store, a variable one a memcpy
        // call per tile and head.
        for (h, all) in all.iter().enumerate().take(g) {
            let to = h * KEY_BLOCK + t * KEY_TILE;
            state.scores[to..to + KEY_TILE].copy_from_slice(all);
        }
    }
}

/// [`block_scores`] for BF16 products: the `g` queries from `qi` (packed
/// by `State::pack_queries`) against the block's key pairs, every lane of
/// both tiles.
#[inline]
fn block_scores_bf16(b: Bf16Isa, qi: usize, g: usize, hd: usize, scale: f32, state: &mut State) {
    let pairs = hd.div_ceil(2);
    let qs: [&[u32]; GROUP_MAX] = std::array::from_fn(|h| {
        let at = (qi + h.min(g - 1)) * pairs;
        &state.q_pairs[at..at + pairs]
    });
    let (rows, _) = state.scores.as_chunks_mut::<KEY_BLOCK>();
    bf16::scores(b, &qs[..g], &state.k_pairs, scale, rows);
}
