//! Keys and values of one sequence, every layer, f32.
//!
//! Values: `[layer][kv_head][position][head_dim]`, one head's values for
//! consecutive positions contiguous, the order the weighted sum reads them.
//! Keys: `[layer][kv_head][tile][head_dim][16]`, tiles of [`KEY_TILE`]
//! positions stored dimension-major, so that attention takes sixteen
//! scores at once with one multiply-add per dimension and no horizontal
//! sum (see `attention::scores`).
//!
//! The cache grows as the sequence does: it starts with room for
//! [`KV_BLOCK`] positions (or fewer, if the sequence can hold no more) and
//! grows by doubling, in whole blocks, up to the capacity it was created
//! with. Every allocation is fallible (`try_reserve`): a host out of memory
//! fails the one sequence that asked for more with
//! [`KernelError::KvCacheAlloc`], instead of aborting the process.

use super::disjoint::DisjointSlice;
use crate::KernelError;

/// Positions per key tile: the sixteen f32 lanes of a zmm.
pub(crate) const KEY_TILE: usize = 16;

/// Positions a cache starts with and grows by (a multiple of [`KEY_TILE`]).
pub const KV_BLOCK: usize = 256;

/// A sequence's KV cache for the CPU backend.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Positions allocated now (the stride of the value rows).
    capacity: usize,
    /// `capacity` rounded up to whole key tiles.
    key_capacity: usize,
    /// Positions the cache may grow to.
    max_capacity: usize,
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
        // The whole capacity must be addressable, though it is allocated only as used.
        let per_position = layers
            .checked_mul(n_kv_heads)
            .and_then(|v| v.checked_mul(head_dim));
        // Keys take at least the values' room: checking them covers both.
        per_position
            .and_then(|v| v.checked_mul(capacity.div_ceil(KEY_TILE) * KEY_TILE))
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
        let mut cache = CpuKvCache {
            layers,
            n_kv_heads,
            head_dim,
            capacity: 0,
            key_capacity: 0,
            max_capacity: capacity,
            keys: Vec::new(),
            values: Vec::new(),
            filled: vec![0; layers],
        };
        cache.grow_to(capacity.min(KV_BLOCK))?;
        Ok(cache)
    }

    /// Bytes a cache of these dimensions holds per position (keys and values, f32).
    pub fn bytes_per_position(layers: usize, n_kv_heads: usize, head_dim: usize) -> usize {
        layers
            .saturating_mul(n_kv_heads)
            .saturating_mul(head_dim)
            .saturating_mul(2 * std::mem::size_of::<f32>())
    }

    /// Bytes allocated now.
    pub fn allocated_bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * std::mem::size_of::<f32>()
    }

    /// Makes room for positions `0..end`, growing by doubling in whole blocks;
    /// [`KernelError::KvCacheFull`] past the capacity the cache was made with,
    /// [`KernelError::KvCacheAlloc`] when the memory cannot be had.
    pub(crate) fn ensure(&mut self, end: usize) -> Result<(), KernelError> {
        if end <= self.capacity {
            return Ok(());
        }
        if end > self.max_capacity {
            return Err(KernelError::KvCacheFull {
                capacity: self.max_capacity,
                position: end - 1,
            });
        }
        let doubled = self.capacity.saturating_mul(2).max(end);
        let target = doubled.div_ceil(KV_BLOCK).saturating_mul(KV_BLOCK);
        self.grow_to(target.min(self.max_capacity))
    }

    /// Reallocates for `capacity` positions, copying what every (layer, KV head) holds.
    fn grow_to(&mut self, capacity: usize) -> Result<(), KernelError> {
        let key_capacity = capacity.div_ceil(KEY_TILE) * KEY_TILE;
        let heads = self.layers * self.n_kv_heads;
        let hd = self.head_dim;
        let keys = regrown(&self.keys, heads, self.key_capacity * hd, key_capacity * hd)
            .ok_or_else(|| self.alloc_error(capacity))?;
        let values = regrown(&self.values, heads, self.capacity * hd, capacity * hd)
            .ok_or_else(|| self.alloc_error(capacity))?;
        self.keys = keys;
        self.values = values;
        self.capacity = capacity;
        self.key_capacity = key_capacity;
        Ok(())
    }

    fn alloc_error(&self, positions: usize) -> KernelError {
        KernelError::KvCacheAlloc {
            positions,
            bytes: Self::bytes_per_position(self.layers, self.n_kv_heads, self.head_dim)
                .saturating_mul(positions),
        }
    }

    /// Positions the cache holds room for now (it grows up to [`Self::max_capacity`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions the cache may grow to.
    pub fn max_capacity(&self) -> usize {
        self.max_capacity
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

/// `old`, `regions` regions of `old_len` floats each, copied into the heads of
/// `regions` regions of `new_len` floats (zeros after); `None` when the memory
/// cannot be had.
fn regrown(old: &[f32], regions: usize, old_len: usize, new_len: usize) -> Option<Vec<f32>> {
    let total = regions.checked_mul(new_len)?;
    let mut grown: Vec<f32> = Vec::new();
    grown.try_reserve_exact(total).ok()?;
    grown.resize(total, 0.0);
    if old_len > 0 {
        for (from, to) in old
            .chunks_exact(old_len)
            .zip(grown.chunks_exact_mut(new_len))
        {
            to[..old_len].copy_from_slice(from);
        }
    }
    Some(grown)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17, case 3: a sequence's cache no longer allocates its whole context up
    /// front (377 MB per SmolLM2 sequence, infallibly): it starts at one block.
    #[test]
    fn a_large_capacity_starts_with_one_block() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64, 8,192 positions.
        let cache = CpuKvCache::new(30, 3, 64, 8192).unwrap();
        let per_position = CpuKvCache::bytes_per_position(30, 3, 64);
        assert_eq!(cache.capacity(), KV_BLOCK);
        assert_eq!(cache.max_capacity(), 8192);
        assert_eq!(cache.allocated_bytes(), per_position * KV_BLOCK);
    }

    #[test]
    fn growing_keeps_every_written_position() {
        let (layers, heads, dim) = (2, 2, 4);
        let mut cache = CpuKvCache::new(layers, heads, dim, 1000).unwrap();
        let entry = |layer: usize, pos: usize, kind: f32| -> Vec<f32> {
            (0..heads * dim)
                .map(|i| kind * 1e6 + (layer * 100_000 + pos * 10 + i) as f32)
                .collect()
        };
        let written = 600;
        for pos in 0..written {
            cache.ensure(pos + 1).unwrap();
            for layer in 0..layers {
                cache.write(layer, pos, &entry(layer, pos, 1.0), &entry(layer, pos, 2.0));
                cache.set_len(layer, pos + 1);
            }
        }
        // 256 → 512 → 1000 (doubling in whole blocks, capped at the capacity).
        assert_eq!(cache.capacity(), 1000);
        for layer in 0..layers {
            for head in 0..heads {
                let values = cache.values(layer, head, written);
                for pos in 0..written {
                    let span = head * dim..(head + 1) * dim;
                    assert_eq!(
                        cache.key(layer, head, pos),
                        entry(layer, pos, 1.0)[span.clone()]
                    );
                    assert_eq!(
                        &values[pos * dim..(pos + 1) * dim],
                        &entry(layer, pos, 2.0)[span]
                    );
                }
            }
        }
    }

    #[test]
    fn growth_stops_at_the_capacity() {
        let mut cache = CpuKvCache::new(1, 1, 4, 300).unwrap();
        cache.ensure(300).unwrap();
        assert_eq!(cache.capacity(), 300);
        assert!(matches!(
            cache.ensure(301),
            Err(KernelError::KvCacheFull {
                capacity: 300,
                position: 300
            })
        ));
    }

    /// Memory that cannot be had fails the one cache that asked (it aborted the
    /// process before: "memory allocation of … bytes failed").
    #[test]
    fn memory_that_cannot_be_had_is_an_error_not_an_abort() {
        // 2^43 positions of 16 floats: 512 TiB, past any address space.
        let positions = 1usize << 43;
        let mut cache = CpuKvCache::new(1, 1, 16, positions).unwrap();
        let error = cache.ensure(positions).unwrap_err();
        assert!(
            matches!(error, KernelError::KvCacheAlloc { positions: p, .. } if p == positions),
            "{error:?}"
        );
        // The cache is unharmed and still usable within what it holds.
        assert_eq!(cache.capacity(), KV_BLOCK);
        cache.ensure(KV_BLOCK).unwrap();
    }
}
