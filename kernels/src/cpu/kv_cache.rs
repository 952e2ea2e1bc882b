//! Keys and values of one sequence, every layer, in the blocks its
//! [`KvLayout`] names (paged: 1024 positions by default).
//!
//! Each layer holds a list of blocks, allocated as positions are written
//! (fallibly: the engine's `kv` module reserved their budget), so memory grows with the tokens held, not
//! with the capacity. A block holds, per KV head, the runs of its key
//! blocks ([`KEY_BLOCK`] positions each, attention's unit) one after
//! another, so a head's part of a block is one contiguous run that
//! attention reads as a stream. A key block's run holds its keys then its
//! values:
//! - keys in tiles of [`KEY_TILE`] positions stored dimension-major
//!   (`[tile][head_dim][16]`), so that attention takes sixteen scores at
//!   once with one multiply-add per dimension and no horizontal sum (see
//!   `attention::scores`);
//! - values position after position (`[position][head_dim]`), the order
//!   the weighted sum reads them.
//!
//! Tasks of different KV heads therefore write apart. Elements are f32, f16 (see `kv_elem`) or Q8_0 (`kv_q8`: per-position
//! groups of int8 with f16 scales, in a byte layout of their own that
//! widens to the one above), chosen by the layout.
//!
//! A layer with a sliding window (Gemma's local layers, Mistral) keeps only
//! a ring of blocks a little larger than its window: position `p` lives in
//! block `(p / block_positions) % ring`, so a long context costs those layers
//! window-sized memory. The ring exceeds the window so that a prompt
//! chunk's rows, written before they are read, never overwrite a key an
//! earlier row of the chunk still needs (see [`CpuKvCache::piece_rows`]).
//!
//! A block is either the cache's own ([`Block::Own`], written in place) or
//! shared read-only with other caches ([`Block::Shared`]): the prompt
//! cache's full prefix blocks (see `kv_shared`). A cache that starts from
//! shared blocks never writes below them (`check_writable`).

use std::sync::Arc;

use half::f16;

use super::disjoint::DisjointSlice;
use super::kv_elem::KvElem;
use super::kv_q8::Q8Byte;
use super::kv_shared_block::{CpuKvBlock, Layers};
#[cfg(test)]
use crate::kv::KvFormat;
use crate::kv::{KvLayout, KvType};
use crate::KernelError;

#[cfg(test)]
use super::kv_layout::{key_at, value_at};
pub(crate) use super::kv_layout::{KEY_BLOCK, KEY_TILE};

/// One layer's block of the layout's `block_positions`.
#[derive(Debug)]
pub(crate) enum Block<E> {
    /// This cache's alone: written in place.
    Own(Vec<E>),
    /// Shared read-only with other caches (a cached prompt prefix).
    Shared(Arc<Vec<E>>),
}

impl<E> Block<E> {
    /// Makes the block shared (it is never written again) and returns a
    /// handle to it.
    pub(crate) fn share(&mut self) -> Arc<Vec<E>> {
        let shared = match std::mem::replace(self, Block::Own(Vec::new())) {
            Block::Own(own) => Arc::new(own),
            Block::Shared(shared) => shared,
        };
        *self = Block::Shared(Arc::clone(&shared));
        shared
    }

    /// The block's elements, whoever holds them.
    pub(crate) fn elems(&self) -> &[E] {
        match self {
            Block::Own(own) => own,
            Block::Shared(shared) => shared,
        }
    }
}

/// Every layer's blocks, of the layout's element type.
#[derive(Debug)]
pub(crate) enum Store {
    F32(Vec<Vec<Block<f32>>>),
    F16(Vec<Vec<Block<f16>>>),
    Q8_0(Vec<Vec<Block<Q8Byte>>>),
}

/// The blocks of one element type inside a [`Store`], and inside a shared
/// block's [`Layers`].
pub(crate) trait Stored: KvElem {
    fn layers(store: &mut Store) -> Option<&mut Vec<Vec<Block<Self>>>>;
    fn shared(layers: &Layers) -> Option<&[Arc<Vec<Self>>]>;
    fn to_shared(layers: Vec<Arc<Vec<Self>>>) -> Layers;
}

impl Stored for f32 {
    fn layers(store: &mut Store) -> Option<&mut Vec<Vec<Block<f32>>>> {
        match store {
            Store::F32(layers) => Some(layers),
            _ => None,
        }
    }

    fn shared(layers: &Layers) -> Option<&[Arc<Vec<f32>>]> {
        match layers {
            Layers::F32(layers) => Some(layers),
            _ => None,
        }
    }

    fn to_shared(layers: Vec<Arc<Vec<f32>>>) -> Layers {
        Layers::F32(layers)
    }
}

impl Stored for f16 {
    fn layers(store: &mut Store) -> Option<&mut Vec<Vec<Block<f16>>>> {
        match store {
            Store::F16(layers) => Some(layers),
            _ => None,
        }
    }

    fn shared(layers: &Layers) -> Option<&[Arc<Vec<f16>>]> {
        match layers {
            Layers::F16(layers) => Some(layers),
            _ => None,
        }
    }

    fn to_shared(layers: Vec<Arc<Vec<f16>>>) -> Layers {
        Layers::F16(layers)
    }
}

impl Stored for Q8Byte {
    fn layers(store: &mut Store) -> Option<&mut Vec<Vec<Block<Q8Byte>>>> {
        match store {
            Store::Q8_0(layers) => Some(layers),
            _ => None,
        }
    }

    fn shared(layers: &Layers) -> Option<&[Arc<Vec<Q8Byte>>]> {
        match layers {
            Layers::Q8_0(layers) => Some(layers),
            _ => None,
        }
    }

    fn to_shared(layers: Vec<Arc<Vec<Q8Byte>>>) -> Layers {
        Layers::Q8_0(layers)
    }
}

/// A sequence's KV cache for the CPU backend.
#[derive(Debug)]
pub struct CpuKvCache {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    dtype: KvType,
    /// Positions per block (the layout's).
    block: usize,
    /// Its blocks: positions per block, per layer the blocks it may hold
    /// and its window.
    layout: KvLayout,
    pub(super) store: Store,
    /// Per layer, positions `0..filled` hold written entries.
    pub(super) filled: Vec<usize>,
    /// The shared prefix blocks it started from: they keep those blocks'
    /// memory while this cache reads them, and nothing below their end is
    /// ever written.
    pub(super) prefix: Vec<CpuKvBlock>,
    /// The end of the blocks this cache handed out to be shared (see
    /// `kv_shared`): never written again either.
    pub(super) shared_end: usize,
}

impl CpuKvCache {
    /// An f32 cache (tests).
    #[cfg(test)]
    pub(crate) fn new(
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self, KernelError> {
        let format = KvFormat::of(KvType::F32);
        Self::windowed(&format, layers, n_kv_heads, head_dim, capacity, &[])
    }

    /// A cache of `format` whose layer `l` keeps a ring for `windows[l]`
    /// when that is `Some` (tests).
    #[cfg(test)]
    pub(crate) fn windowed(
        format: &KvFormat,
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
    ) -> Result<Self, KernelError> {
        let layout = KvLayout::new(*format, layers, n_kv_heads, head_dim, capacity, windows)?;
        Ok(Self::empty(&layout))
    }

    /// An empty cache of `layout`'s blocks, none allocated yet.
    pub(crate) fn empty(layout: &KvLayout) -> Self {
        let layers = layout.layers();
        let store = match layout.dtype() {
            KvType::F32 => Store::F32((0..layers).map(|_| Vec::new()).collect()),
            KvType::F16 => Store::F16((0..layers).map(|_| Vec::new()).collect()),
            KvType::Q8_0 => Store::Q8_0((0..layers).map(|_| Vec::new()).collect()),
        };
        CpuKvCache {
            layers,
            n_kv_heads: layout.n_kv_heads(),
            head_dim: layout.head_dim(),
            capacity: layout.capacity(),
            dtype: layout.dtype(),
            block: layout.block_positions(),
            layout: layout.clone(),
            store,
            filled: vec![0; layers],
            prefix: Vec::new(),
            shared_end: 0,
        }
    }

    /// Fails when a write at `start` would land in a shared prefix block
    /// (which other caches read): such a cache only ever appends after
    /// its prefix.
    pub(crate) fn check_writable(&self, start: usize) -> Result<(), KernelError> {
        let shared_end = self.shared_end.max(self.prefix.len() * self.block);
        if start < shared_end {
            return Err(KernelError::Shape {
                op: "kv_cache",
                detail: format!(
                    "a write at position {start} would change the shared prompt-cache prefix \
                     of {shared_end} positions"
                ),
            });
        }
        Ok(())
    }

    /// Rows of one prompt chunk that layer `layer` can take in one go: a
    /// windowed layer's ring holds the window plus this many rows less one,
    /// so writing them before reading overwrites nothing still needed.
    pub(crate) fn piece_rows(&self, layer: usize) -> usize {
        match (self.window(layer), self.layout.max_blocks(layer)) {
            (Some(w), blocks) if blocks * self.block < self.capacity => {
                (blocks * self.block + 1).saturating_sub(w).max(1)
            }
            _ => usize::MAX,
        }
    }

    /// Layer `layer`'s sliding window, if it has one.
    pub(crate) fn window(&self, layer: usize) -> Option<usize> {
        self.layout.window(layer)
    }

    /// The layout it was made for.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> KvType {
        self.dtype
    }

    /// Bytes of the blocks allocated so far.
    pub fn allocated_bytes(&self) -> usize {
        // Shared blocks counted too: this cache reads them.
        (0..self.layers)
            .map(|l| self.layer_allocated_bytes(l))
            .sum()
    }

    /// Bytes of the blocks `layer` holds (0 for an unknown layer): a
    /// windowed layer's stay at its ring however long the context.
    pub fn layer_allocated_bytes(&self, layer: usize) -> usize {
        let blocks = match &self.store {
            Store::F32(layers) => layers.get(layer).map_or(0, Vec::len),
            Store::F16(layers) => layers.get(layer).map_or(0, Vec::len),
            Store::Q8_0(layers) => layers.get(layer).map_or(0, Vec::len),
        };
        blocks * self.layout.block_bytes()
    }

    /// Positions per block.
    pub fn block_positions(&self) -> usize {
        self.block
    }

    /// Key blocks (attention's unit) per block.
    pub(super) fn key_blocks(&self) -> usize {
        self.block / KEY_BLOCK
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn layers(&self) -> usize {
        self.layers
    }

    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Positions written so far in `layer` (0 for an unknown layer).
    pub fn len(&self, layer: usize) -> usize {
        self.filled.get(layer).copied().unwrap_or(0)
    }

    /// Whether no layer holds any position.
    pub fn is_empty(&self) -> bool {
        self.filled.iter().all(|f| *f == 0)
    }

    /// Forgets every position, so the cache can serve a new sequence (its
    /// blocks stay allocated for it). A cache that started from a shared
    /// prefix keeps it (its layout's budget does not cover those blocks):
    /// the new sequence goes on after it.
    pub fn clear(&mut self) {
        let keep = self.prefix.len() * self.block;
        self.filled.iter_mut().for_each(|f| *f = keep);
    }

    /// Allocates `layer`'s blocks for positions `0..end` (a ring's at
    /// most); fails, leaving the cache as it was usable, when the OS
    /// refuses the memory.
    pub(crate) fn ensure<E: Stored>(
        &mut self,
        layer: usize,
        end: usize,
    ) -> Result<(), KernelError> {
        // The layout checked that this does not overflow.
        let len = self.n_kv_heads * self.key_blocks() * E::run_len(self.head_dim);
        let wanted = end.div_ceil(self.block).min(self.layout.max_blocks(layer));
        let Some(blocks) = E::layers(&mut self.store).and_then(|l| l.get_mut(layer)) else {
            return Err(self.dtype_error::<E>());
        };
        while blocks.len() < wanted {
            let mut block: Vec<E> = Vec::new();
            block
                .try_reserve_exact(len)
                .map_err(|_| KernelError::KvAlloc {
                    bytes: len * std::mem::size_of::<E>(),
                })?;
            block.resize(len, E::default());
            blocks.push(Block::Own(block));
        }
        Ok(())
    }

    fn dtype_error<E>(&self) -> KernelError {
        KernelError::Shape {
            op: "attention",
            detail: format!(
                "a {} KV cache read as {}; every cache of one call must share the backend's type",
                self.dtype,
                std::any::type_name::<E>()
            ),
        }
    }

    /// Stores `key` and `value` (each `n_kv_heads × head_dim`) at
    /// `position` of `layer`, whose block [`CpuKvCache::ensure`] allocated.
    pub(crate) fn write<E: Stored>(
        &mut self,
        layer: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), KernelError> {
        let hd = self.head_dim;
        let heads = self.layer_heads::<E>(layer)?;
        for head in 0..heads.n_kv_heads {
            let span = head * hd..(head + 1) * hd;
            // SAFETY: `heads` lives only in this call and nothing else
            // borrows the cache meanwhile.
            unsafe { heads.write(head, position, &key[span.clone()], &value[span]) };
        }
        Ok(())
    }

    /// Layer `layer`'s blocks as one view whose KV heads tasks of one job
    /// can write and read apart (see [`LayerHeads`]).
    pub(crate) fn layer_heads<E: Stored>(
        &mut self,
        layer: usize,
    ) -> Result<LayerHeads<'_, E>, KernelError> {
        let (n_kv_heads, head_dim) = (self.n_kv_heads, self.head_dim);
        let key_blocks = self.key_blocks();
        let ring = self.layout.max_blocks(layer);
        let error = self.dtype_error::<E>();
        let blocks = E::layers(&mut self.store)
            .and_then(|l| l.get_mut(layer))
            .ok_or(error)?;
        Ok(LayerHeads {
            blocks: blocks
                .iter_mut()
                .map(|b| match b {
                    Block::Own(own) => DisjointSlice::new(own.as_mut_slice()),
                    // SAFETY: a shared block lies below the cache's prefix
                    // end, and `check_writable` refuses every write there
                    // before the attention that would make it.
                    Block::Shared(shared) => unsafe { DisjointSlice::read_only(shared.as_slice()) },
                })
                .collect(),
            n_kv_heads,
            head_dim,
            key_blocks,
            ring,
        })
    }

    /// Marks `0..end` of `layer` written; positions past `end` are stale
    /// (a rewrite at an earlier position truncates the sequence).
    pub(crate) fn set_len(&mut self, layer: usize, end: usize) {
        if let Some(filled) = self.filled.get_mut(layer) {
            *filled = end;
        }
    }

    /// `head`'s key at `position` of `layer`, widened to f32.
    #[cfg(test)]
    pub(crate) fn key(&mut self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        let hd = self.head_dim;
        let at = key_at(position % KEY_BLOCK, hd);
        self.head_run(layer, head, position)
            .into_iter()
            .skip(at)
            .step_by(KEY_TILE)
            .take(hd)
            .collect()
    }

    /// `head`'s value at `position` of `layer`, widened to f32.
    #[cfg(test)]
    pub(crate) fn value(&mut self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        let hd = self.head_dim;
        let at = value_at(position % KEY_BLOCK, hd);
        self.head_run(layer, head, position)[at..at + hd].to_vec()
    }

    /// The f32 copy of `head`'s run of the key block holding `position`.
    #[cfg(test)]
    fn head_run(&mut self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        fn widen<E: Stored>(cache: &mut CpuKvCache, l: usize, h: usize, p: usize) -> Vec<f32> {
            let heads = cache.layer_heads::<E>(l).unwrap();
            let b = (p / KEY_BLOCK) % heads.ring();
            // SAFETY: nothing writes meanwhile.
            let run = unsafe { heads.key_block(h, b) };
            let mut scratch = Vec::new();
            E::widen(
                crate::cpu::isa::CheckedIsa::at_most(crate::cpu::Isa::Scalar),
                run,
                &mut scratch,
            )
            .to_vec()
        }
        match self.dtype {
            KvType::F32 => widen::<f32>(self, layer, head, position),
            KvType::F16 => widen::<f16>(self, layer, head, position),
            KvType::Q8_0 => widen::<Q8Byte>(self, layer, head, position),
        }
    }
}

/// One layer of a [`CpuKvCache`], split by KV head: the attention job's
/// task for a KV head of a one-tile sequence (a decode step) writes that
/// head's new keys and values itself and then reads them, so the writes
/// run in parallel instead of before the job on the calling thread.
pub(crate) struct LayerHeads<'a, E> {
    blocks: Vec<DisjointSlice<'a, E>>,
    n_kv_heads: usize,
    head_dim: usize,
    /// Blocks the layer may hold: position `p` lives in block
    /// `(p / block_positions) % ring`.
    ring: usize,
    /// Key blocks per block.
    key_blocks: usize,
}

impl<E: KvElem> LayerHeads<'_, E> {
    /// Key blocks the layer cycles through (a windowed layer's ring, else
    /// enough for the whole capacity): position `p` lives in key block
    /// `(p / KEY_BLOCK) % ring()`.
    pub(crate) fn ring(&self) -> usize {
        self.ring * self.key_blocks
    }

    /// Key blocks per block (one allocation).
    pub(crate) fn key_blocks(&self) -> usize {
        self.key_blocks
    }

    /// Elements of one KV head's run of a key block.
    fn run_len(&self) -> usize {
        E::run_len(self.head_dim)
    }

    /// Where `head`'s run of key block `key_block` (of the ring) lies: its
    /// block, and the offset in it.
    fn run_at(&self, head: usize, key_block: usize) -> (usize, usize) {
        let in_block = key_block % self.key_blocks;
        let at = (head * self.key_blocks + in_block) * self.run_len();
        (key_block / self.key_blocks, at)
    }

    /// Stores `head`'s `key` and `value` (`head_dim` each) at `position`,
    /// rounded to `E`, in its block (allocated: the caller ensured it).
    ///
    /// # Safety
    /// No other thread may read or write `head` of this layer meanwhile.
    pub(crate) unsafe fn write(&self, head: usize, position: usize, key: &[f32], value: &[f32]) {
        let (block, at) = self.run_at(head, (position / KEY_BLOCK) % self.ring().max(1));
        // SAFETY: the run belongs to `head`, which the caller holds alone.
        let run = unsafe { self.blocks[block].range(at, self.run_len()) };
        E::store(run, position % KEY_BLOCK, key, value);
    }

    /// `head`'s run of key block `key_block` (of the ring): two key tiles,
    /// then [`KEY_BLOCK`] values.
    ///
    /// # Safety
    /// No thread may write `head` of this layer while the borrow lives.
    pub(crate) unsafe fn key_block(&self, head: usize, key_block: usize) -> &[E] {
        let (block, at) = self.run_at(head, key_block);
        // SAFETY: the caller's promise.
        unsafe { self.blocks[block].get(at, self.run_len()) }
    }

    /// Key blocks allocated (the caller checks that reads stay below).
    pub(crate) fn allocated(&self) -> usize {
        self.blocks.len() * self.key_blocks
    }
}
