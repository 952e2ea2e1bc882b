//! Keys and values of one sequence, every layer, f32.
//!
//! Values: `[layer][kv_head][slot][head_dim]`, one head's values for
//! consecutive positions contiguous, the order the weighted sum reads them.
//! Keys: `[layer][kv_head][tile][head_dim][16]`, tiles of [`KEY_TILE`]
//! positions stored dimension-major, so that attention takes sixteen
//! scores at once with one multiply-add per dimension and no horizontal
//! sum (see `attention::scores`). Memory is zero-filled lazily by the
//! allocator, so a large capacity costs address space, not RAM, until
//! used.
//!
//! A layer with a sliding window (Gemma's local layers, Mistral) keeps only
//! a ring of slots a little larger than its window: position `p` lives in
//! slot `p % ring`, so a long context costs those layers window-sized
//! memory. The ring is a multiple of the attention's key block, so a block
//! of positions maps onto one contiguous run of slots; it exceeds the
//! window so that a prompt chunk's rows, written before they are read,
//! never overwrite a key an earlier row of the chunk still needs (see
//! [`CpuKvCache::piece_rows`]).

use super::disjoint::DisjointSlice;
use crate::KernelError;

/// Positions per key tile: the sixteen f32 lanes of a zmm.
pub(crate) const KEY_TILE: usize = 16;

/// A ring is a multiple of this many slots: the attention's key block
/// (`attention::stream::KEY_BLOCK`), so blocks never wrap.
pub(crate) const RING_ALIGN: usize = 2 * KEY_TILE;

/// Slots a ring holds beyond its window: a prompt chunk writes this many
/// rows (plus one) at a time in a windowed layer.
pub(crate) const RING_SLACK: usize = 128;

/// A sequence's KV cache for the CPU backend.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    /// Slots per layer: `capacity` rounded up to whole key tiles, or a
    /// windowed layer's ring when that is smaller.
    slots: Vec<usize>,
    /// Per layer, its sliding window (positions a row sees, itself
    /// included), if any.
    windows: Vec<Option<usize>>,
    /// Where each layer's keys and values start (in f32s).
    bases: Vec<usize>,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// Per layer, positions `0..filled` hold written entries.
    filled: Vec<usize>,
}

impl CpuKvCache {
    #[cfg(test)]
    pub(crate) fn new(
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self, KernelError> {
        Self::windowed(layers, n_kv_heads, head_dim, capacity, &[])
    }

    /// A cache whose layer `l` keeps a ring for `windows[l]` when that is
    /// `Some` (layers past `windows` keep every position).
    pub(crate) fn windowed(
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
    ) -> Result<Self, KernelError> {
        let full = capacity.div_ceil(KEY_TILE) * KEY_TILE;
        let window_of = |l: usize| windows.get(l).copied().flatten().filter(|w| *w > 0);
        let slots: Vec<usize> = (0..layers)
            .map(|l| match window_of(l) {
                Some(w) => {
                    let ring = w.saturating_add(RING_SLACK).div_ceil(RING_ALIGN) * RING_ALIGN;
                    ring.min(full)
                }
                None => full,
            })
            .collect();
        let per_slot = n_kv_heads.checked_mul(head_dim);
        let mut bases = Vec::with_capacity(layers + 1);
        let mut total = Some(0usize);
        for s in &slots {
            bases.push(total.unwrap_or_default());
            total = total.and_then(|t| t.checked_add(per_slot?.checked_mul(*s)?));
        }
        // Keys and values each take `total` floats.
        let total = total
            .filter(|len| {
                len.checked_mul(8)
                    .is_some_and(|bytes| bytes <= isize::MAX as usize)
            })
            .ok_or_else(|| KernelError::Shape {
                op: "kv_cache",
                detail: format!(
                    "{layers} layers × {n_kv_heads} KV heads × {head_dim} × {capacity} positions \
                     overflows memory; lower the context length"
                ),
            })?;
        Ok(CpuKvCache {
            layers,
            n_kv_heads,
            head_dim,
            capacity,
            windows: (0..layers).map(window_of).collect(),
            slots,
            bases,
            keys: vec![0.0; total],
            values: vec![0.0; total],
            filled: vec![0; layers],
        })
    }

    /// Rows of one prompt chunk that layer `layer` can take in one go: a
    /// windowed layer's ring holds the window plus this many rows less one,
    /// so writing them before reading overwrites nothing still needed.
    pub(crate) fn piece_rows(&self, layer: usize) -> usize {
        match (
            self.windows.get(layer).copied().flatten(),
            self.slots.get(layer),
        ) {
            (Some(w), Some(&slots)) if slots < self.capacity => {
                (slots + 1).saturating_sub(w).max(1)
            }
            _ => usize::MAX,
        }
    }

    /// Layer `layer`'s sliding window, if it has one.
    pub(crate) fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    /// f32s of keys (and of values) the cache holds, every layer.
    pub fn floats(&self) -> usize {
        self.keys.len()
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

    /// Forgets every position, so the cache can serve a new sequence.
    pub fn clear(&mut self) {
        self.filled.iter_mut().for_each(|f| *f = 0);
    }

    /// Where `head`'s values (and key tiles) of `layer` start.
    #[cfg(test)]
    fn key_base(&self, layer: usize, head: usize) -> usize {
        self.bases[layer] + head * self.slots[layer] * self.head_dim
    }

    /// Stores `key` and `value` (each `n_kv_heads × head_dim`) at
    /// `position` of `layer`; the caller checked bounds.
    pub(crate) fn write(&mut self, layer: usize, position: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        let heads = self.layer_heads(layer);
        for head in 0..heads.n_kv_heads {
            let span = head * hd..(head + 1) * hd;
            // SAFETY: `heads` lives only in this call and nothing else
            // borrows the cache meanwhile.
            unsafe { heads.write(head, position, &key[span.clone()], &value[span]) };
        }
    }

    /// Layer `layer`'s keys and values as one view whose KV heads tasks of
    /// one job can write and read apart (see [`LayerHeads`]).
    pub(crate) fn layer_heads(&mut self, layer: usize) -> LayerHeads<'_> {
        let slots = self.slots.get(layer).copied().unwrap_or(0);
        let len = self.n_kv_heads * slots * self.head_dim;
        let base = self.bases.get(layer).copied().unwrap_or(0);
        LayerHeads {
            keys: DisjointSlice::new(&mut self.keys[base..base + len]),
            values: DisjointSlice::new(&mut self.values[base..base + len]),
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            slots,
        }
    }

    /// Marks `0..end` of `layer` written; positions past `end` are stale
    /// (a rewrite at an earlier position truncates the sequence).
    pub(crate) fn set_len(&mut self, layer: usize, end: usize) {
        if let Some(filled) = self.filled.get_mut(layer) {
            *filled = end;
        }
    }

    /// `head`'s key at `position` of `layer`, gathered out of its tile.
    #[cfg(test)]
    pub(crate) fn key(&self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        let slot = position % self.slots[layer];
        let (tile, lane) = (slot / KEY_TILE, slot % KEY_TILE);
        let at = self.key_base(layer, head) + tile * KEY_TILE * self.head_dim + lane;
        (0..self.head_dim)
            .map(|d| self.keys[at + d * KEY_TILE])
            .collect()
    }

    /// Values of `head` in `layer` for positions `0..count`, position after
    /// position.
    #[cfg(test)]
    pub(crate) fn values(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.key_base(layer, head);
        &self.values[at..at + count * self.head_dim]
    }
}

/// One layer of a [`CpuKvCache`], split by KV head: the attention job's
/// task for a KV head of a one-tile sequence (a decode step) writes that
/// head's new keys and values itself and then reads them, so the writes
/// run in parallel instead of before the job on the calling thread.
pub(crate) struct LayerHeads<'a> {
    keys: DisjointSlice<'a, f32>,
    values: DisjointSlice<'a, f32>,
    n_kv_heads: usize,
    head_dim: usize,
    /// Slots per head: position `p` lives in slot `p % slots`.
    slots: usize,
}

impl LayerHeads<'_> {
    /// Slots per head (a windowed layer's ring, else the whole capacity).
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// Stores `head`'s `key` and `value` (`head_dim` each) at `position`
    /// (below the capacity: the caller checked bounds), in its slot.
    ///
    /// # Safety
    /// No other thread may read or write `head` of this layer meanwhile.
    pub(crate) unsafe fn write(&self, head: usize, position: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        let slot = position % self.slots.max(1);
        let (tile, lane) = (slot / KEY_TILE, slot % KEY_TILE);
        let tile_at = (head * self.slots + tile * KEY_TILE) * hd;
        // SAFETY: the tile and the value row belong to `head`, which the
        // caller holds alone.
        let (tile, row) = unsafe {
            (
                self.keys.range(tile_at, KEY_TILE * hd),
                self.values.range((head * self.slots + slot) * hd, hd),
            )
        };
        for (d, k) in key.iter().enumerate() {
            tile[d * KEY_TILE + lane] = *k;
        }
        row.copy_from_slice(value);
    }

    /// `head`'s key tiles covering slots `0..count` (`count` at most the
    /// slots): `KEY_TILE · head_dim` floats per tile; lanes past `count` in
    /// the last tile are stale or zero.
    ///
    /// # Safety
    /// No thread may write `head` of this layer while the borrow lives.
    pub(crate) unsafe fn key_tiles(&self, head: usize, count: usize) -> &[f32] {
        let hd = self.head_dim;
        // SAFETY: the caller's promise.
        unsafe {
            self.keys.get(
                head * self.slots * hd,
                count.div_ceil(KEY_TILE) * KEY_TILE * hd,
            )
        }
    }

    /// `head`'s values for slots `0..count`.
    ///
    /// # Safety
    /// As for [`LayerHeads::key_tiles`].
    pub(crate) unsafe fn values(&self, head: usize, count: usize) -> &[f32] {
        let hd = self.head_dim;
        // SAFETY: the caller's promise.
        unsafe { self.values.get(head * self.slots * hd, count * hd) }
    }
}
