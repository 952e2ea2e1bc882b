//! One sequence's KV: the backend's cache of its blocks, the shared
//! prompt blocks it starts from, and the budget its own blocks hold.

use std::ops::Range;
use std::sync::Arc;

use switchyard_kernels::{Backend, KvLayout, KvPrefix};

use super::block::SharedBlock;
use super::budget::{KvPool, Reservation};
use super::KvError;
use crate::model::LlamaModel;

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

    /// A cache of `capacity` positions for `model`'s layers, in `pool`'s
    /// format, starting from `prefix`.
    pub fn for_model(
        backend: &B,
        pool: &Arc<KvPool>,
        model: &LlamaModel<B>,
        capacity: usize,
        prefix: KvPrefix<'_, SharedBlock<B>>,
    ) -> Result<Self, KvError> {
        let layout = model.kv_layout(pool.format(), capacity)?;
        Self::new(backend, pool, layout, prefix)
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

    /// Forgets positions from `end` on (a speculative draft's rejected
    /// tokens). The backend takes a write at an earlier position as the
    /// cache's new end, so the entries past `end` stay in memory, unread,
    /// until the next forward writes over them from `end`; this is the
    /// policy's check that such a rewrite is allowed. (A windowed layer's
    /// ring holds `RING_SLACK` positions past its window, so a rollback of
    /// fewer positions never lost a key the window still reads.)
    pub fn truncate(&mut self, end: usize) -> Result<(), KvError> {
        let shared = self.prefix.len() * self.layout.block_positions();
        if end < shared {
            return Err(KvError::Shared { end, shared });
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use switchyard_kernels::cpu::{CpuActivations, CpuBackend};
    use switchyard_kernels::{AttentionRows, AttentionShape, KvFormat, KvType};

    use super::*;
    use crate::kv::{CachedBlock, KvConfig};

    const BLOCK: usize = 32;

    /// Writes positions `0..n` of both layers of `kv` (one KV head of 32).
    fn write(backend: &CpuBackend, kv: &mut SequenceKv<CpuBackend>, n: usize) {
        let shape = AttentionShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 32,
            scale: 0.2,
            window: None,
            softcap: None,
        };
        let values: Vec<f32> = (0..n * 32).map(|i| (i % 7) as f32 / 7.0).collect();
        let x = CpuActivations::from_values(n, 32, &values).unwrap();
        let mut out = CpuActivations::zeros(n, 32);
        for layer in 0..2 {
            let mut seqs = [AttentionRows {
                cache: kv.device(),
                rows: 0..n,
                start_pos: 0,
            }];
            backend
                .attention(layer, shape, &x, &x, &x, &mut seqs, &mut out)
                .unwrap();
        }
    }

    #[test]
    fn caches_and_shared_blocks_hold_their_budget_until_the_last_handle_drops() {
        let backend = CpuBackend::new(1);
        let pool = KvPool::new(KvConfig {
            dtype: KvType::F32,
            budget_bytes: usize::MAX / 2,
            block_positions: BLOCK,
        });
        let layout = || KvLayout::new(KvFormat::new(KvType::F32, BLOCK), 2, 1, 32, 4 * BLOCK, &[]);
        let mut first =
            SequenceKv::new(&backend, &pool, layout().unwrap(), KvPrefix::none()).unwrap();
        let own = first.layout().bytes_beyond(0);
        assert_eq!((pool.reserved_bytes(), first.reserved_bytes()), (own, own));
        write(&backend, &mut first, BLOCK + 8);
        let block = first.share(&backend, 0..BLOCK).unwrap();
        // 2 layers × keys and values × 32 positions × 32 dims × 4 bytes.
        assert_eq!(block.bytes(), 2 * 2 * BLOCK * 32 * 4);
        assert_eq!(pool.reserved_bytes(), own + block.bytes());
        // Positions not yet written cannot be had, and reserve nothing.
        assert!(first.share(&backend, BLOCK..2 * BLOCK).is_err());
        assert_eq!(pool.reserved_bytes(), own + block.bytes());

        let prefix = KvPrefix {
            shared: std::slice::from_ref(&block),
            tail: None,
        };
        let mut second = SequenceKv::new(&backend, &pool, layout().unwrap(), prefix).unwrap();
        assert_eq!(second.reserved_bytes(), own - 2 * BLOCK * 2 * 32 * 4);
        assert_eq!(block.holders(), 2);
        // A block it started from comes back as it is: no second reservation.
        let again = second.share(&backend, 0..BLOCK).unwrap();
        assert_eq!(block.holders(), 3);
        drop(again);
        let before = pool.reserved_bytes();
        drop(first);
        drop(second);
        assert_eq!(
            before - pool.reserved_bytes(),
            2 * own - 2 * BLOCK * 2 * 32 * 4
        );
        assert_eq!(pool.reserved_bytes(), block.bytes());
        drop(block);
        assert_eq!(pool.reserved_bytes(), 0);
    }

    #[test]
    fn a_cache_past_the_budget_is_refused_before_the_backend_allocates() {
        let backend = CpuBackend::new(1);
        let pool = KvPool::new(KvConfig {
            dtype: KvType::F16,
            budget_bytes: 1000,
            block_positions: BLOCK,
        });
        let layout = KvLayout::new(pool.format(), 2, 1, 32, 4 * BLOCK, &[]).unwrap();
        match SequenceKv::new(&backend, &pool, layout, KvPrefix::none()) {
            Err(KvError::Budget {
                needed,
                budget: 1000,
                free: 1000,
            }) => {
                assert_eq!(needed, 2 * 4 * 2 * BLOCK * 32 * 2);
            }
            Err(e) => panic!("expected a budget refusal, got {e}"),
            Ok(_) => panic!("expected a budget refusal"),
        }
        assert_eq!(pool.reserved_bytes(), 0);
    }
}
