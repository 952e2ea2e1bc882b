//! Keys and values of one sequence, every layer, f32.
//!
//! Values: `[layer][kv_head][position][head_dim]`, one head's values for
//! consecutive positions contiguous, the order the weighted sum reads them.
//! Keys: `[layer][kv_head][tile][head_dim][16]`, tiles of [`KEY_TILE`]
//! positions stored dimension-major, so that attention takes sixteen
//! scores at once with one multiply-add per dimension and no horizontal
//! sum (see `attention::scores`). Capacity is fixed at creation (rounded
//! up to whole tiles for keys); memory is zero-filled lazily by the
//! allocator, so a large capacity costs address space, not RAM, until
//! used.

use super::disjoint::DisjointSlice;
use crate::KernelError;

/// Positions per key tile: the sixteen f32 lanes of a zmm.
pub(crate) const KEY_TILE: usize = 16;

/// A sequence's KV cache for the CPU backend.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    /// `capacity` rounded up to whole key tiles.
    key_capacity: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// Per layer, positions `0..filled` hold written entries.
    filled: Vec<usize>,
}

impl CpuKvCache {
    pub(crate) fn new(
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self, KernelError> {
        let key_capacity = capacity.div_ceil(KEY_TILE) * KEY_TILE;
        let per_position = layers
            .checked_mul(n_kv_heads)
            .and_then(|v| v.checked_mul(head_dim));
        // Keys take at least the values' room: checking them covers both.
        let key_len = per_position
            .and_then(|v| v.checked_mul(key_capacity))
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
            key_capacity,
            keys: vec![0.0; key_len],
            values: vec![0.0; per_position.unwrap_or_default() * capacity],
            filled: vec![0; layers],
        })
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

    #[cfg(test)]
    fn offset(&self, layer: usize, head: usize, position: usize) -> usize {
        ((layer * self.n_kv_heads + head) * self.capacity + position) * self.head_dim
    }

    /// Where `head`'s key tiles of `layer` start.
    #[cfg(test)]
    fn key_base(&self, layer: usize, head: usize) -> usize {
        (layer * self.n_kv_heads + head) * self.key_capacity * self.head_dim
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
        let key_len = self.n_kv_heads * self.key_capacity * self.head_dim;
        let value_len = self.n_kv_heads * self.capacity * self.head_dim;
        LayerHeads {
            keys: DisjointSlice::new(&mut self.keys[layer * key_len..(layer + 1) * key_len]),
            values: DisjointSlice::new(
                &mut self.values[layer * value_len..(layer + 1) * value_len],
            ),
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            capacity: self.capacity,
            key_capacity: self.key_capacity,
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
        let (tile, lane) = (position / KEY_TILE, position % KEY_TILE);
        let at = self.key_base(layer, head) + tile * KEY_TILE * self.head_dim + lane;
        (0..self.head_dim)
            .map(|d| self.keys[at + d * KEY_TILE])
            .collect()
    }

    /// Values of `head` in `layer` for positions `0..count`, position after
    /// position.
    #[cfg(test)]
    pub(crate) fn values(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.offset(layer, head, 0);
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
    capacity: usize,
    key_capacity: usize,
}

impl LayerHeads<'_> {
    /// Stores `head`'s `key` and `value` (`head_dim` each) at `position`
    /// (below the capacity: the caller checked bounds).
    ///
    /// # Safety
    /// No other thread may read or write `head` of this layer meanwhile.
    pub(crate) unsafe fn write(&self, head: usize, position: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        let (tile, lane) = (position / KEY_TILE, position % KEY_TILE);
        let tile_at = (head * self.key_capacity + tile * KEY_TILE) * hd;
        // SAFETY: the tile and the value row belong to `head`, which the
        // caller holds alone.
        let (tile, row) = unsafe {
            (
                self.keys.range(tile_at, KEY_TILE * hd),
                self.values
                    .range((head * self.capacity + position) * hd, hd),
            )
        };
        for (d, k) in key.iter().enumerate() {
            tile[d * KEY_TILE + lane] = *k;
        }
        row.copy_from_slice(value);
    }

    /// `head`'s key tiles covering positions `0..count`: `KEY_TILE ·
    /// head_dim` floats per tile; lanes past `count` in the last tile are
    /// stale or zero.
    ///
    /// # Safety
    /// No thread may write `head` of this layer while the borrow lives.
    pub(crate) unsafe fn key_tiles(&self, head: usize, count: usize) -> &[f32] {
        let hd = self.head_dim;
        // SAFETY: the caller's promise.
        unsafe {
            self.keys.get(
                head * self.key_capacity * hd,
                count.div_ceil(KEY_TILE) * KEY_TILE * hd,
            )
        }
    }

    /// `head`'s values for positions `0..count`.
    ///
    /// # Safety
    /// As for [`LayerHeads::key_tiles`].
    pub(crate) unsafe fn values(&self, head: usize, count: usize) -> &[f32] {
        let hd = self.head_dim;
        // SAFETY: the caller's promise.
        unsafe { self.values.get(head * self.capacity * hd, count * hd) }
    }
}
