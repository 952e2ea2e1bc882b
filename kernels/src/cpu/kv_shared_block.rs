//! A handle to a KV block shared read-only between caches (see
//! `kv_shared` for how blocks are handed out and taken up): what the
//! caches holding it and the prompt cache see of it.

use std::sync::Arc;

use half::f16;

use super::kv_q8::Q8Byte;

/// One shared block of every layer, in the pool's element type.
#[derive(Debug)]
pub(crate) enum Layers {
    F32(Vec<Arc<Vec<f32>>>),
    F16(Vec<Arc<Vec<f16>>>),
    Q8_0(Vec<Arc<Vec<Q8Byte>>>),
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) layers: Layers,
    pub(super) n_kv_heads: usize,
    pub(super) head_dim: usize,
    /// Positions of the block.
    pub(super) positions: usize,
    /// The block's bytes, every layer.
    pub(super) bytes: usize,
}

/// A handle to one shared block (the layout's `block_positions`, or a
/// copied tail's, every layer).
/// Cloning it is cheap; the block's memory goes back when the last handle
/// (the prompt cache's, or a cache reading it) drops.
#[derive(Clone, Debug)]
pub struct CpuKvBlock(pub(super) Arc<Shared>);

impl CpuKvBlock {
    /// Handles to the block alive now.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Bytes of the block's memory.
    pub fn bytes(&self) -> usize {
        self.0.bytes
    }
}
