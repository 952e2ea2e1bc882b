//! A prompt's BF16 products on AMX over a span of key blocks (up to
//! [`SPAN_BLOCKS`], 256 positions) at once, flash-attention style: the
//! span's scores for a group of queries in AMX tiles summed over all of a
//! query's dimensions, one online-softmax step per query and span, and
//! the weighted sum with each output tile loaded and stored once per span.
//!
//! Why: folding one key block of 32 positions at a time, a tile of 128
//! queries of 256 dimensions reads and writes its whole 128 KB of outputs
//! (from L2) for every 32 keys, rescales them whenever a block raises a
//! query's maximum, and runs a softmax step (two horizontal reductions)
//! per query and block: at depth that cost several times the `tdpbf16ps`
//! work itself. Over a span those costs fall by the span's length.
//!
//! The results are not `blocked`'s chain sums, nor the per-block
//! softmax's: a score is one AMX sum over all pairs (not two chains), and
//! the maximum and the rescale are per span. Both are within the f32
//! rounding of the same BF16 products, as AMX already was (`blocked_amx`).
//!
//! Every row of a prompt takes this path, in any chunk (`stream::run_amx`),
//! and its result depends only on its query, its position and the cache:
//! spans start at fixed multiples of positions ([`stop`]); a `tdpbf16ps`
//! sum of one query and one key (or one output and one block) reads no
//! other query's row; the positions a row does not see in a span weigh
//! exactly 0 outside its softmax; and the blocks a chunk adds around them
//! only add zero products to its outputs, which leave them as they were.

use std::ops::Range;

use super::bf16::{self, Bf16Isa};
use super::bf16x3;
use super::span_pack::{self, BlockOut, Widened};
use crate::cpu::exp::{exp_one, exp_shifted, max_of};
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::KvElem;
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};
use crate::cpu::vecmath::scale_in_place;

/// Key blocks a span holds at most: 256 positions. Its packed keys and
/// values (128 KB each at 256 dimensions) stay in L2 while every group
/// of queries reads them.
pub(super) const SPAN_BLOCKS: usize = 8;

/// Queries a span pass takes at once: two AMX tiles of sixteen rows.
const GROUP: usize = 32;

/// Rows of an AMX tile: a tile's queries are padded with zeros to a
/// multiple of it (a chunk of one row takes one tile of sixteen).
pub(super) const QUERY_ROWS: usize = 16;

/// Whether a prompt's queries of `head_dim` take the span fold: AMX is
/// available and the head size is whole tile columns of sixteen pairs (a
/// multiple of 32).
pub(super) fn takes(b: Bf16Isa, head_dim: usize) -> bool {
    b.amx() && head_dim > 0 && head_dim.is_multiple_of(32)
}

/// Where the span from `at` (a block start) ends: at the next multiple
/// of the span's length ([`SPAN_BLOCKS`] blocks) or of `segment` (where
/// the walk closes its state), or the block that holds `end - 1`. The
/// spans are cut at fixed positions, not at anything about the tile, so
/// a row's softmax steps are the same in any chunk.
pub(super) fn stop(at: usize, end: usize, segment: usize) -> usize {
    let len = span_blocks() * KEY_BLOCK;
    let next_span = (at / len + 1) * len;
    let next_segment = (at / segment.max(1) + 1) * segment.max(1);
    next_span
        .min(next_segment)
        .min(end.next_multiple_of(KEY_BLOCK))
}

/// [`SPAN_BLOCKS`]; `SWITCHYARD_AMX_SPAN` overrides it (1 to 32 blocks, to
/// measure).
fn span_blocks() -> usize {
    static BLOCKS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&BLOCKS, "SWITCHYARD_AMX_SPAN", SPAN_BLOCKS, |b| {
        (1..=32).contains(&b)
    })
}

/// A span's keys and values in BF16 pairs, and the scratch of its fold,
/// reused across spans on a thread.
#[derive(Default)]
pub(super) struct Span {
    /// Key tiles one after another (`bf16::pack_key_tile`'s layout).
    keys: Vec<u32>,
    /// Pair rows of positions (`bf16::pack`'s layout), `head_dim` each.
    values: Vec<u32>,
    /// Blocks packed so far.
    blocks: usize,
    scratch: FoldScratch,
}

/// The packed blocks a span fold reads: its own (`Span`) or a call's
/// shared ones (`span_share`), `span_pack::block_pairs` a block each.
#[derive(Clone, Copy)]
pub(super) struct SpanBlocks<'a> {
    pub(super) keys: &'a [u32],
    pub(super) values: &'a [u32],
    pub(super) blocks: usize,
}

/// A group's scores, then its probabilities (`GROUP` rows of the span),
/// and the probabilities in pairs of positions.
#[derive(Default)]
pub(super) struct FoldScratch {
    scores: Vec<f32>,
    p: Vec<u32>,
}

impl Span {
    /// Starts an empty span.
    pub(super) fn clear(&mut self) {
        self.blocks = 0;
    }

    /// The next block's place, the buffers grown to hold it.
    fn next(&mut self, b: Bf16Isa, head_dim: usize) -> BlockOut<'_> {
        let len = span_pack::block_pairs(b, head_dim);
        let w = self.blocks;
        grow(&mut self.keys, (w + 1) * len);
        grow(&mut self.values, (w + 1) * len);
        BlockOut {
            keys: &mut self.keys[w * len..(w + 1) * len],
            values: &mut self.values[w * len..(w + 1) * len],
        }
    }

    /// Adds a whole key block: `keys` two key tiles dimension-major,
    /// `values` 32 rows of `head_dim`, as `Tile::block` gives them.
    #[cfg(test)]
    pub(super) fn push(&mut self, b: Bf16Isa, head_dim: usize, keys: &[f32], values: &[f32]) {
        span_pack::pack_f32(b, head_dim, keys, values, self.next(b, head_dim));
        self.blocks += 1;
    }

    /// [`Span::push`] straight from an F16 cache's run (two key tiles,
    /// then 32 value rows, as stored; `span_pack::pack_f16`). False, with
    /// nothing added, where the AVX-512 kernel does not run.
    #[cfg(test)]
    pub(super) fn push_f16(&mut self, b: Bf16Isa, head_dim: usize, run: &[half::f16]) -> bool {
        let added = span_pack::pack_f16(b, head_dim, run, self.next(b, head_dim)).is_ok();
        self.blocks += usize::from(added);
        added
    }

    /// Adds the key block `run` of a cache, its first `written` positions
    /// this walk's (`span_pack::pack_run`).
    pub(super) fn push_run<E: KvElem>(
        &mut self,
        isa: CheckedIsa,
        (b, head_dim): (Bf16Isa, usize),
        run: (&[E], usize),
        scratch: &mut Widened,
    ) {
        span_pack::pack_run(isa, b, head_dim, run, scratch, self.next(b, head_dim));
        self.blocks += 1;
    }

    /// [`FoldScratch::fold`] of the blocks packed here.
    pub(super) fn fold(
        &mut self,
        isa: CheckedIsa,
        b: Bf16Isa,
        q: &SpanQueries<'_>,
        seen: impl Fn(usize) -> Range<usize>,
        state: (&mut [f32], &mut [f32], &mut [f32]),
    ) {
        let blocks = SpanBlocks {
            keys: &self.keys,
            values: &self.values,
            blocks: self.blocks,
        };
        self.scratch.fold(isa, b, blocks, q, seen, state);
    }
}

impl FoldScratch {
    /// Folds the span `span` into the queries `q.q` (see [`SpanQueries`];
    /// the span and the queries both split, or neither, as `b` says): per query the scores of
    /// the span's positions it sees (`seen(qi)`, lanes of the span) times
    /// `scale` (then capped), one online-softmax step over them (`max`,
    /// `sum`, and `acc` rescaled when they raise the maximum), and the
    /// probabilities' weighted sum of the values added to `acc`
    /// (`head_dim` per query, the padded queries' too). A position a
    /// query does not see weighs exactly 0 and is left out of its maximum
    /// and sum; a query that sees none keeps its state, its outputs
    /// gaining only zero products. Needs [`takes`] true for `head_dim`.
    pub(super) fn fold(
        &mut self,
        isa: CheckedIsa,
        b: Bf16Isa,
        span: SpanBlocks<'_>,
        q: &SpanQueries<'_>,
        seen: impl Fn(usize) -> Range<usize>,
        (max, sum, acc): (&mut [f32], &mut [f32], &mut [f32]),
    ) {
        let (n, head_dim) = (q.n, q.head_dim);
        // Split operands (`bf16x3`) are `terms` times as long.
        let terms = bf16x3::terms(b);
        let pairs = terms * head_dim / 2;
        let keys = span.blocks * KEY_BLOCK;
        let rows = terms * keys / 2;
        let padded = n.next_multiple_of(QUERY_ROWS);
        if keys == 0 || !takes(b, head_dim) {
            return;
        }
        let (qs, acc) = (&q.q[..padded * pairs], &mut acc[..padded * head_dim]);
        let (max, sum) = (&mut max[..n], &mut sum[..n]);
        let k = &span.keys[..span.blocks * 2 * pairs * KEY_TILE];
        let v = &span.values[..rows * head_dim];
        grow(&mut self.scores, GROUP * keys);
        grow(&mut self.p, GROUP * rows);
        for q0 in (0..padded).step_by(GROUP) {
            let m = (padded - q0).min(GROUP);
            let two = m > QUERY_ROWS;
            // SAFETY: `takes` (AMX granted, `pairs` whole tiles); `qs`
            // holds rows q0..q0 + m of `pairs` pairs (`padded` is whole
            // tiles), `k` the span's 2 · blocks key tiles, `scores`
            // `GROUP` rows of `keys` (all cut or sized above).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                super::blocked_amx::span_scores(
                    (qs[q0 * pairs..].as_ptr(), two),
                    pairs,
                    (k.as_ptr(), 2 * span.blocks),
                    self.scores.as_mut_ptr(),
                )
            };
            for i in 0..m {
                let qi = q0 + i;
                let row = &mut self.scores[i * keys..(i + 1) * keys];
                let lanes = if qi < n { seen(qi) } else { 0..0 };
                let lanes = lanes.start.min(keys)..lanes.end.min(keys);
                if lanes.is_empty() {
                    row.fill(0.0);
                } else {
                    let (before, rest) = row.split_at_mut(lanes.start);
                    let (s, after) = rest.split_at_mut(lanes.len());
                    before.fill(0.0);
                    after.fill(0.0);
                    scale_in_place(isa, q.scale, s);
                    if let Some(cap) = q.softcap {
                        for x in s.iter_mut() {
                            *x = cap * (*x / cap).tanh();
                        }
                    }
                    let span_max = max_of(isa, s);
                    if span_max > max[qi] {
                        // The first step finds the sum zero: nothing to rescale.
                        if sum[qi] != 0.0 {
                            let c = exp_one(isa, max[qi] - span_max);
                            sum[qi] *= c;
                            scale_in_place(isa, c, &mut acc[qi * head_dim..(qi + 1) * head_dim]);
                        }
                        max[qi] = span_max;
                    }
                    sum[qi] += exp_shifted(isa, s, max[qi]);
                }
                let p = &mut self.p[i * rows..(i + 1) * rows];
                if b.split() {
                    bf16x3::pack_probabilities(b, row, p);
                } else {
                    bf16::pack_in_order(b, row, p);
                }
            }
            // SAFETY: as above; `p` holds `m` rows of `rows` pairs (a
            // multiple of sixteen), `v` that many pair rows of
            // `head_dim` (a multiple of 32), `acc` rows q0..q0 + m.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                super::blocked_amx::span_weighted(
                    (self.p.as_ptr(), two),
                    rows,
                    (v.as_ptr(), head_dim),
                    acc[q0 * head_dim..].as_mut_ptr(),
                )
            };
            // Elsewhere `takes` is false and nothing gets here.
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (k, v, two);
        }
    }
}

/// `v` at least `len` long. Never shorter: a span's buffers are written
/// before they are read, and truncating them to grow them again block
/// by block cost a fill of every block as large as its packing.
fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// The queries of [`Span::fold`] and what their scores take.
pub(super) struct SpanQueries<'a> {
    /// BF16 pairs in order, `head_dim / 2` a query (`bf16::pack_in_order`;
    /// three times that for split operands, `bf16x3::pack_query`), padded
    /// with zero queries to a multiple of [`QUERY_ROWS`].
    pub(super) q: &'a [u32],
    /// Queries before the padding.
    pub(super) n: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub(super) softcap: Option<f32>,
}

#[cfg(test)]
#[path = "blocked_span_tests.rs"]
mod tests;
