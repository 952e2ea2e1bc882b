//! One sequence's KV: the backend's cache of its blocks, the shared
//! prompt blocks it starts from, and the budget its own blocks hold.

use std::ops::Range;
use std::sync::Arc;

use switchyard_kernels::{Backend, KvLayout, KvPrefix};

use super::block::SharedBlock;
use super::budget::{KvPool, Reservation};
use super::KvError;

/// A sequence's KV cache.
pub struct SequenceKv<B: Backend> {
    cache: B::KvCache,
    layout: KvLayout,
    pool: Arc<KvPool>,
    /// The shared blocks it started from: held while it reads them.
    prefix: Vec<SharedBlock<B>>,
    /// The budget of every block of its own it may hold.
    reservation: Reservation,
}

impl<B: Backend> SequenceKv<B> {
    /// A cache of `layout` starting from `prefix`, reserving from `pool`
    /// every block it may hold beyond the shared ones (before the backend
    /// allocates anything).
    pub fn new(
        backend: &B,
        pool: &Arc<KvPool>,
        layout: KvLayout,
        prefix: KvPrefix<'_, SharedBlock<B>>,
    ) -> Result<Self, KvError> {
        let reservation = pool.reserve(layout.bytes_beyond(prefix.shared.len()))?;
        let devices: Vec<B::KvBlock> = prefix.shared.iter().map(|b| b.device().clone()).collect();
        let device_prefix = KvPrefix {
            shared: &devices,
            tail: prefix.tail.map(|(block, n)| (block.device(), n)),
        };
        let cache = backend.kv_cache(&layout, device_prefix)?;
        Ok(SequenceKv {
            cache,
            layout,
            pool: Arc::clone(pool),
            prefix: prefix.shared.to_vec(),
            reservation,
        })
    }

    /// The backend's cache, for the forward pass.
    pub fn device(&mut self) -> &mut B::KvCache {
        &mut self.cache
    }

    /// The backend's cache, to read.
    pub fn cache(&self) -> &B::KvCache {
        &self.cache
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Bytes its own blocks reserved (the shared ones are their handles').
    pub fn reserved_bytes(&self) -> usize {
        self.reservation.bytes()
    }

    /// Positions `positions` (a whole block, or the written start of one)
    /// as a block for the prompt cache, its bytes reserved from the pool.
    /// A block it started from is handed back as it is.
    pub fn share(
        &mut self,
        backend: &B,
        positions: Range<usize>,
    ) -> Result<SharedBlock<B>, KvError> {
        let block = self.layout.block_positions();
        let whole = positions.len() == block && positions.start.is_multiple_of(block);
        if whole {
            if let Some(held) = self.prefix.get(positions.start / block) {
                return Ok(held.clone());
            }
        }
        if self.layout.windowed() || (whole && !self.layout.full_blocks()) {
            return Err(KvError::NotShareable);
        }
        let bytes = self
            .layout
            .shared_bytes(positions.len())
            .ok_or(KvError::NotShareable)?;
        let reservation = self.pool.reserve(bytes)?;
        let device = backend.kv_block(&mut self.cache, positions)?;
        Ok(SharedBlock::new(device, reservation))
    }
}
