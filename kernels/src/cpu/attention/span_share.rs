//! A call's key blocks packed once for all of a prompt chunk's tiles.
//!
//! Why: a prompt chunk runs several tiles per KV head (four of 32 rows
//! for a chunk of 128: more tasks than threads), and each tile's AMX walk
//! (`stream::run_amx`) packed every block it read into BF16 pairs itself,
//! so each block was packed once per tile; under `bf16x3` a block packs
//! to three times `bf16-prompt`'s bytes. Here the blocks that a
//! (sequence, KV head)'s tiles read are packed once, by all the pool's
//! threads, before the tiles run, and each tile folds its spans from them.
//!
//! Same bits: a block packs the same way wherever it is packed
//! (`span_pack`). The one block that differs is a tile's last: a tile
//! gives values 0 to the positions past its last row, the shared block to
//! those past the chunk's. So a tile reads a shared span only where each
//! of its blocks is whole for the tile or the tile ends where the chunk
//! does ([`SharedBlocks::span`]); otherwise it packs that span itself as
//! before (only where a chunk does not start at a block's edge).
//!
//! Memory: a block packs to 2 · `span_pack::block_pairs` pairs, 96 KiB
//! under `bf16x3` at 256 dimensions (32 KiB under `bf16-prompt`): Gemma
//! 3's one KV head at 32k positions is 94 MiB (31 MiB). A call shares at
//! most [`MAX_MIB`]: each (sequence, KV head)'s first blocks up to it,
//! the tiles packing the rest themselves. The buffer is kept for the next
//! call on the calling thread, so it holds up to that much between calls.

use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

use super::bf16::Bf16Isa;
use super::blocked_span::{SpanBlocks, SPAN_BLOCKS};
use super::span_pack::{self, BlockOut, Widened};
use crate::cpu::disjoint::DisjointSlice;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::KvElem;
use crate::cpu::kv_layout::KEY_BLOCK;
use crate::cpu::kv_store::LayerHeads;
use crate::cpu::threads::ThreadPool;

/// The most a call's shared blocks hold, in MiB: 64, all of a 32k
/// context under `bf16-prompt`, its first 21k positions under `bf16x3`.
/// `SWITCHYARD_AMX_SHARE_MIB` overrides it (0 shares nothing; to measure).
const MAX_MIB: usize = 64;

fn max_bytes() -> usize {
    static MIB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&MIB, "SWITCHYARD_AMX_SHARE_MIB", MAX_MIB, |_| true) << 20
}

/// A (sequence, KV head) whose tiles would share their blocks.
pub(super) struct Want<'c, 'a, E> {
    pub(super) seq: usize,
    pub(super) kv_head: usize,
    pub(super) cache: &'c LayerHeads<'a, E>,
    /// The tiles' products (AMX takes them: `blocked_span::takes`).
    pub(super) b: Bf16Isa,
    /// Key blocks (by position, `p / KEY_BLOCK`) the tiles read.
    pub(super) blocks: Range<usize>,
    /// Positions written: the chunk's last row and those before it.
    pub(super) end: usize,
}

/// One (sequence, KV head)'s shared blocks in the buffer: their keys
/// from `at`, then their values.
struct Entry {
    seq: usize,
    kv_head: usize,
    first: usize,
    blocks: usize,
    block_pairs: usize,
    end: usize,
    at: usize,
}

/// Every shared block of a call.
pub(super) struct Shared<'s> {
    entries: Vec<Entry>,
    pairs: &'s [u32],
}

/// One (sequence, KV head)'s shared blocks, as its tiles read them.
#[derive(Clone, Copy)]
pub(super) struct SharedBlocks<'s> {
    keys: &'s [u32],
    values: &'s [u32],
    first: usize,
    blocks: usize,
    block_pairs: usize,
    end: usize,
}

impl<'s> Shared<'s> {
    pub(super) fn get(&self, seq: usize, kv_head: usize) -> Option<SharedBlocks<'s>> {
        let e = self
            .entries
            .iter()
            .find(|e| e.seq == seq && e.kv_head == kv_head)?;
        let len = e.blocks * e.block_pairs;
        Some(SharedBlocks {
            keys: &self.pairs[e.at..e.at + len],
            values: &self.pairs[e.at + len..e.at + 2 * len],
            first: e.first,
            blocks: e.blocks,
            block_pairs: e.block_pairs,
            end: e.end,
        })
    }
}

impl<'s> SharedBlocks<'s> {
    /// Key blocks `from..to` (by position) for a tile whose rows end at
    /// `end`: shared, and packed as the tile would pack them (each whole
    /// for the tile, or the tile's last rows the chunk's).
    pub(super) fn span(&self, from: usize, to: usize, end: usize) -> Option<SpanBlocks<'s>> {
        let shared = self.first <= from && from < to && to <= self.first + self.blocks;
        if !shared || (to * KEY_BLOCK > end && end != self.end) {
            return None;
        }
        let range = (from - self.first) * self.block_pairs..(to - self.first) * self.block_pairs;
        Some(SpanBlocks {
            keys: &self.keys[range.clone()],
            values: &self.values[range],
            blocks: to - from,
        })
    }
}

thread_local! {
    static BUFFER: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static WIDENED: RefCell<Widened> = RefCell::new(Widened::default());
}

/// `f` of this thread's `key`, or of a fresh one where a nested call on
/// this thread holds it.
fn reuse<T: Default, R>(key: &'static LocalKey<RefCell<T>>, f: impl FnOnce(&mut T) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut held) => f(&mut held),
        Err(_) => f(&mut T::default()),
    })
}

/// Packs `wants`' blocks (up to [`MAX_MIB`], in order) over `pool`, then
/// runs `job` with them. The caches must not be written until it returns.
pub(super) fn with_shared<E: KvElem, R>(
    pool: &ThreadPool,
    isa: CheckedIsa,
    head_dim: usize,
    wants: &[Want<'_, '_, E>],
    job: impl FnOnce(&Shared<'_>) -> R,
) -> R {
    let (entries, len) = plan(head_dim, wants);
    if entries.is_empty() {
        return job(&Shared {
            entries,
            pairs: &[],
        });
    }
    reuse(&BUFFER, |buffer| {
        if buffer.len() < len {
            buffer.resize(len, 0);
        }
        pack(pool, isa, head_dim, wants, &entries, &mut buffer[..len]);
        job(&Shared {
            entries,
            pairs: &buffer[..len],
        })
    })
}

/// Each want's place in the buffer, and the buffer's length.
fn plan<E>(head_dim: usize, wants: &[Want<'_, '_, E>]) -> (Vec<Entry>, usize) {
    let mut left = max_bytes() / size_of::<u32>();
    let mut at = 0;
    let mut entries = Vec::new();
    for w in wants {
        let block_pairs = span_pack::block_pairs(w.b, head_dim);
        let blocks = w.blocks.len().min(left / (2 * block_pairs).max(1));
        if blocks == 0 {
            continue;
        }
        entries.push(Entry {
            seq: w.seq,
            kv_head: w.kv_head,
            first: w.blocks.start,
            blocks,
            block_pairs,
            end: w.end,
            at,
        });
        at += 2 * blocks * block_pairs;
        left -= 2 * blocks * block_pairs;
    }
    (entries, at)
}

/// Packs every entry's blocks into `pairs`, a task per span's worth.
fn pack<E: KvElem>(
    pool: &ThreadPool,
    isa: CheckedIsa,
    head_dim: usize,
    wants: &[Want<'_, '_, E>],
    entries: &[Entry],
    pairs: &mut [u32],
) {
    let tasks: Vec<(usize, Range<usize>)> = entries
        .iter()
        .enumerate()
        .flat_map(|(i, e)| {
            (0..e.blocks)
                .step_by(SPAN_BLOCKS)
                .map(move |k| (i, k..(k + SPAN_BLOCKS).min(e.blocks)))
        })
        .collect();
    let out = DisjointSlice::new(pairs);
    pool.run(tasks.len(), &|t| {
        let (i, blocks) = &tasks[t];
        let e = &entries[*i];
        let Some(w) = wants
            .iter()
            .find(|w| w.seq == e.seq && w.kv_head == e.kv_head)
        else {
            return;
        };
        let bp = e.block_pairs;
        let n = blocks.len() * bp;
        // SAFETY: each task writes its own blocks' keys and values of its
        // entry, and entries do not overlap (`plan`).
        let (keys, values) = unsafe {
            (
                out.range(e.at + blocks.start * bp, n),
                out.range(e.at + (e.blocks + blocks.start) * bp, n),
            )
        };
        let ring = w.cache.ring().max(1);
        reuse(&WIDENED, |scratch| {
            let each = keys.chunks_exact_mut(bp).zip(values.chunks_exact_mut(bp));
            for (k, (keys, values)) in blocks.clone().zip(each) {
                let block = e.first + k;
                // SAFETY: nothing writes the cache while the call's tasks
                // run (the caller's promise).
                let run = unsafe { w.cache.key_block(w.kv_head, block % ring) };
                let written = e.end.saturating_sub(block * KEY_BLOCK);
                let out = BlockOut { keys, values };
                span_pack::pack_run(isa, w.b, head_dim, (run, written), scratch, out);
            }
        });
    });
}

#[cfg(test)]
#[path = "span_share_tests.rs"]
mod tests;
