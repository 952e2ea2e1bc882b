//! Keys and values of one sequence, every layer, f32.
//!
//! Layout `[layer][kv_head][position][head_dim]`: one head's keys for
//! consecutive positions are contiguous, which is the order attention reads
//! them in. Capacity is fixed at creation; memory is zero-filled lazily by
//! the allocator, so a large capacity costs address space, not RAM, until
//! used.

use crate::KernelError;

/// A sequence's KV cache for the CPU backend.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
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
        let len = layers
            .checked_mul(n_kv_heads)
            .and_then(|v| v.checked_mul(head_dim))
            .and_then(|v| v.checked_mul(capacity))
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
            keys: vec![0.0; len],
            values: vec![0.0; len],
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

    /// Stores `key` and `value` (each `n_kv_heads × head_dim`) at
    /// `position` of `layer`; the caller checked bounds.
    pub(crate) fn write(&mut self, layer: usize, position: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        for head in 0..self.n_kv_heads {
            let at = self.offset(layer, head, position);
            self.keys[at..at + hd].copy_from_slice(&key[head * hd..(head + 1) * hd]);
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

    /// Keys (or values) of `head` in `layer` for positions `0..count`,
    /// position after position.
    pub(crate) fn keys(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.offset(layer, head, 0);
        &self.keys[at..at + count * self.head_dim]
    }

    pub(crate) fn values(&self, layer: usize, head: usize, count: usize) -> &[f32] {
        let at = self.offset(layer, head, 0);
        &self.values[at..at + count * self.head_dim]
    }
}
