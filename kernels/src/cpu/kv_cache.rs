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

    fn offset(&self, layer: usize, head: usize, position: usize) -> usize {
        ((layer * self.n_kv_heads + head) * self.capacity + position) * self.head_dim
    }

    /// Where `head`'s key tiles of `layer` start.
    fn key_base(&self, layer: usize, head: usize) -> usize {
        (layer * self.n_kv_heads + head) * self.key_capacity * self.head_dim
    }

    /// Stores `key` and `value` (each `n_kv_heads × head_dim`) at
    /// `position` of `layer`; the caller checked bounds.
    pub(crate) fn write(&mut self, layer: usize, position: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        let (tile, lane) = (position / KEY_TILE, position % KEY_TILE);
        for head in 0..self.n_kv_heads {
            let at = self.key_base(layer, head) + tile * KEY_TILE * hd + lane;
            for (d, k) in key[head * hd..(head + 1) * hd].iter().enumerate() {
                self.keys[at + d * KEY_TILE] = *k;
            }
            let at = self.offset(layer, head, position);
            self.values[at..at + hd].copy_from_slice(&value[head * hd..(head + 1) * hd]);
        }
    }

    /// Marks `0..end` of `layer` written; positions past `end` are stale
    /// (a rewrite at an earlier position truncates the sequence).
    pub(crate) fn set_len(&mut self, layer: usize, end: usize) {
        if let Some(filled) = self.filled.get_mut(layer) {
            *filled = end;
        }
    }

    /// The key tiles of `head` in `layer` that cover positions `0..count`
    /// (`KEY_TILE · head_dim` floats per tile; lanes past `count` in the
    /// last tile are stale or zero).
    pub(crate) fn key_tiles(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.key_base(layer, head);
        &self.keys[at..at + count.div_ceil(KEY_TILE) * KEY_TILE * self.head_dim]
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
    pub(crate) fn values(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.offset(layer, head, 0);
        &self.values[at..at + count * self.head_dim]
    }
}
