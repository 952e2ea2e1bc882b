//! Full KV blocks shared read-only between caches: the prompt cache's
//! unit.
//!
//! A sequence whose prompt filled block `b` in every layer can hand that
//! block out ([`CpuKvCache::share_block`]): the block becomes
//! [`Block::Shared`] in its cache (it is never written again: later
//! positions go to later blocks) and a [`CpuKvBlock`] handle takes a
//! reservation of its bytes from the pool, so the budget keeps counting
//! the block after the sequence ends, for as long as some handle lives. A
//! later cache starts from such blocks ([`CpuKvCache::with_prefix`]),
//! reserving only its own blocks beyond them.
//!
//! While the sequence that filled a block still runs, the block is counted
//! twice (its cache reserved its capacity up front, the handle reserves
//! again): admission errs on the safe side for that while.
//!
//! Sliding-window layers keep rings whose blocks are overwritten as the
//! window moves, so a cache with one cannot share or take shared blocks.

use std::sync::Arc;

use super::kv_cache::{block_len, Block, CpuKvCache, Store};
use super::kv_pool::{KvPool, KvType};
use super::kv_shared_block::{CpuKvBlock, Layers, Shared};
use crate::KernelError;

fn refuse(detail: String) -> KernelError {
    KernelError::Shape {
        op: "kv_share",
        detail,
    }
}

impl CpuKvCache {
    /// Shares block `block` (positions `block * block_positions..`, written in
    /// every layer), reserving its bytes from `pool` for the handle.
    pub(crate) fn share_block(
        &mut self,
        pool: &Arc<KvPool>,
        block: usize,
    ) -> Result<CpuKvBlock, KernelError> {
        if let Some(held) = self.prefix.get(block) {
            return Ok(held.clone());
        }
        if (0..self.layers()).any(|l| self.window(l).is_some()) {
            return Err(refuse(
                "a cache with sliding-window layers cannot share blocks".into(),
            ));
        }
        if self.block_positions() != pool.block_positions() {
            return Err(refuse(format!(
                "a cache of {} positions has blocks of its length, not the pool's {}",
                self.capacity(),
                pool.block_positions()
            )));
        }
        let positions = self.block_positions();
        let end = (block + 1) * positions;
        if self.filled.iter().any(|f| *f < end) {
            return Err(refuse(format!(
                "block {block} is not written in every layer (positions up to {end})"
            )));
        }
        let (n_kv_heads, head_dim) = (self.n_kv_heads(), self.head_dim());
        let bytes = block_len(n_kv_heads, head_dim, positions)
            .and_then(|len| self.dtype().bytes_of(len))
            .and_then(|b| b.checked_mul(self.layers()))
            .ok_or_else(|| refuse("the block's size overflows".into()))?;
        let reservation = pool.reserve(bytes)?;
        let missing = || refuse(format!("block {block} is not allocated in every layer"));
        let layers = match &mut self.store {
            Store::F32(layers) => Layers::F32(
                layers
                    .iter_mut()
                    .map(|blocks| blocks.get_mut(block).map(Block::share))
                    .collect::<Option<_>>()
                    .ok_or_else(missing)?,
            ),
            Store::F16(layers) => Layers::F16(
                layers
                    .iter_mut()
                    .map(|blocks| blocks.get_mut(block).map(Block::share))
                    .collect::<Option<_>>()
                    .ok_or_else(missing)?,
            ),
            Store::Q8_0(layers) => Layers::Q8_0(
                layers
                    .iter_mut()
                    .map(|blocks| blocks.get_mut(block).map(Block::share))
                    .collect::<Option<_>>()
                    .ok_or_else(missing)?,
            ),
        };
        self.shared_end = self.shared_end.max(end);
        Ok(CpuKvBlock(Arc::new(Shared {
            layers,
            n_kv_heads,
            head_dim,
            positions,
            reservation,
        })))
    }

    /// A cache of `capacity` positions whose first `prefix.len()` blocks
    /// are `prefix` (read-only, already written): the sequence goes on
    /// from position `prefix.len() * block_positions`. Reserves only the blocks
    /// beyond the prefix.
    pub(crate) fn with_prefix(
        pool: &Arc<KvPool>,
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
        prefix: &[CpuKvBlock],
    ) -> Result<Self, KernelError> {
        if prefix.is_empty() {
            return Self::windowed(pool, layers, n_kv_heads, head_dim, capacity, windows);
        }
        if windows.iter().flatten().any(|w| *w > 0) {
            return Err(refuse(
                "a cache with sliding-window layers cannot start from shared blocks".into(),
            ));
        }
        let end = prefix.len() * pool.block_positions();
        if end >= capacity {
            return Err(refuse(format!(
                "a shared prefix of {end} positions leaves no room in a cache of {capacity}"
            )));
        }
        let fits = |b: &CpuKvBlock| {
            let typed = match (&b.0.layers, pool.dtype()) {
                (Layers::F32(l), KvType::F32) => Some(l.len()),
                (Layers::F16(l), KvType::F16) => Some(l.len()),
                (Layers::Q8_0(l), KvType::Q8_0) => Some(l.len()),
                _ => None,
            };
            typed == Some(layers)
                && b.0.n_kv_heads == n_kv_heads
                && b.0.head_dim == head_dim
                && b.0.positions == pool.block_positions()
        };
        if !prefix.iter().all(fits) {
            return Err(refuse(
                "a shared block's type or shape differs from the cache's".into(),
            ));
        }
        let mut cache = Self::reserving(
            pool,
            layers,
            n_kv_heads,
            head_dim,
            capacity,
            windows,
            prefix.len(),
        )?;
        for (l, filled) in cache.filled.iter_mut().enumerate() {
            *filled = end;
            for block in prefix {
                match (&mut cache.store, &block.0.layers) {
                    (Store::F32(mine), Layers::F32(theirs)) => {
                        if let (Some(m), Some(t)) = (mine.get_mut(l), theirs.get(l)) {
                            m.push(Block::Shared(Arc::clone(t)));
                        }
                    }
                    (Store::F16(mine), Layers::F16(theirs)) => {
                        if let (Some(m), Some(t)) = (mine.get_mut(l), theirs.get(l)) {
                            m.push(Block::Shared(Arc::clone(t)));
                        }
                    }
                    (Store::Q8_0(mine), Layers::Q8_0(theirs)) => {
                        if let (Some(m), Some(t)) = (mine.get_mut(l), theirs.get(l)) {
                            m.push(Block::Shared(Arc::clone(t)));
                        }
                    }
                    // Checked above (`fits`).
                    _ => {}
                }
            }
        }
        cache.prefix = prefix.to_vec();
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SharedKvBlock;
    use crate::cpu::kv_pool::KvConfig;

    /// Positions per block: two key blocks, so that a block's runs hold
    /// more than one.
    const BLOCK: usize = 64;

    /// Positions of the tests' caches: a few blocks.
    const CAPACITY: usize = 4 * BLOCK;

    fn filled_cache(pool: &Arc<KvPool>, positions: usize) -> CpuKvCache {
        filled_cache_of(pool, CAPACITY, positions)
    }

    fn filled_cache_of(pool: &Arc<KvPool>, capacity: usize, positions: usize) -> CpuKvCache {
        let mut cache = CpuKvCache::windowed(pool, 2, 1, 4, capacity, &[]).unwrap();
        for layer in 0..2 {
            cache.ensure::<f32>(layer, positions).unwrap();
            for p in 0..positions {
                let key = [p as f32, layer as f32, 1.0, 2.0];
                let value = [-(p as f32), 3.0, 4.0, layer as f32];
                cache.write::<f32>(layer, p, &key, &value).unwrap();
            }
            cache.set_len(layer, positions);
        }
        cache
    }

    #[test]
    fn a_cache_from_shared_blocks_reads_what_the_first_wrote_and_reserves_only_the_rest() {
        let pool = KvPool::unlimited_blocks(KvType::F32, BLOCK);
        let mut first = filled_cache(&pool, 2 * BLOCK + 6);
        let blocks: Vec<_> = (0..2)
            .map(|b| first.share_block(&pool, b).unwrap())
            .collect();
        assert!(
            first.share_block(&pool, 2).is_err(),
            "block 2 is half written"
        );
        let own = first.reserved_bytes();
        let mut second = CpuKvCache::with_prefix(&pool, 2, 1, 4, CAPACITY, &[], &blocks).unwrap();
        assert_eq!(second.len(0), 2 * BLOCK);
        assert_eq!(second.reserved_bytes(), own - 2 * blocks[0].bytes());
        for layer in 0..2 {
            for p in [0, 31, 32, BLOCK, 2 * BLOCK - 1] {
                assert_eq!(second.key(layer, 0, p), first.key(layer, 0, p));
                assert_eq!(second.value(layer, 0, p), first.value(layer, 0, p));
            }
        }
        assert!(second.check_writable(2 * BLOCK - 1).is_err());
        assert!(second.check_writable(2 * BLOCK).is_ok());
        // The handle here and the second cache's: the first cache holds the
        // data, not a handle (its own reservation covers it).
        assert_eq!(blocks[0].holders(), 2);
        drop(second);
        assert_eq!(blocks[0].holders(), 1);
    }

    #[test]
    fn shared_blocks_hold_their_budget_until_the_last_handle_drops() {
        let pool = KvPool::new(KvConfig {
            dtype: KvType::F32,
            budget_bytes: usize::MAX / 2,
            block_positions: BLOCK,
        });
        let mut first = filled_cache(&pool, BLOCK + 8);
        let block = first.share_block(&pool, 0).unwrap();
        drop(first);
        assert_eq!(pool.reserved_bytes(), block.bytes());
        drop(block);
        assert_eq!(pool.reserved_bytes(), 0);
    }

    #[test]
    fn q8_0_blocks_are_shared_at_their_own_size() {
        use crate::cpu::kv_q8::{round_q8, Q8Byte};
        let (layers, head_dim) = (2, 64);
        let pool = KvPool::unlimited_blocks(KvType::Q8_0, BLOCK);
        let mut first = CpuKvCache::windowed(&pool, layers, 1, head_dim, CAPACITY, &[]).unwrap();
        let row = |p: usize, sign: f32| -> Vec<f32> {
            (0..head_dim)
                .map(|d| sign * (p * 7 + d) as f32 / 13.0)
                .collect()
        };
        for layer in 0..layers {
            first.ensure::<Q8Byte>(layer, BLOCK + 8).unwrap();
            for p in 0..BLOCK + 8 {
                first
                    .write::<Q8Byte>(layer, p, &row(p, 1.0), &row(p, -1.0))
                    .unwrap();
            }
            first.set_len(layer, BLOCK + 8);
        }
        let block = first.share_block(&pool, 0).unwrap();
        // 34 bytes per 32 keys and values of every layer.
        assert_eq!(block.bytes(), layers * 2 * BLOCK * head_dim / 32 * 34);
        let mut second =
            CpuKvCache::with_prefix(&pool, layers, 1, head_dim, CAPACITY, &[], &[block]).unwrap();
        for p in [0, 17, 31, 40, BLOCK - 1] {
            assert_eq!(second.key(1, 0, p), round_q8(&row(p, 1.0)));
            assert_eq!(second.value(1, 0, p), round_q8(&row(p, -1.0)));
        }
        let f32_pool = KvPool::unlimited_blocks(KvType::F32, BLOCK);
        let other = CpuKvCache::with_prefix(
            &f32_pool,
            layers,
            1,
            head_dim,
            CAPACITY,
            &[],
            &second.prefix,
        );
        assert!(other.is_err(), "a q8_0 block taken up by an f32 cache");
    }

    #[test]
    fn a_cache_shorter_than_a_block_holds_its_length_and_shares_nothing() {
        let pool = KvPool::unlimited_blocks(KvType::F32, 4 * BLOCK);
        let mut short = filled_cache_of(&pool, BLOCK + 3, BLOCK + 3);
        // Its capacity in whole key blocks: 96 positions, not 256.
        assert_eq!(short.block_positions(), BLOCK + 32);
        // 2 layers × keys and values × 96 positions × 4 dims × 4 bytes.
        assert_eq!(short.allocated_bytes(), 2 * 2 * (BLOCK + 32) * 4 * 4);
        assert!(short.share_block(&pool, 0).is_err());
    }

    #[test]
    fn windowed_caches_neither_share_nor_take_shared_blocks() {
        let pool = KvPool::unlimited_blocks(KvType::F32, BLOCK);
        let mut first = filled_cache(&pool, BLOCK + 8);
        let block = first.share_block(&pool, 0).unwrap();
        let windows = [Some(16), None];
        assert!(CpuKvCache::with_prefix(&pool, 2, 1, 4, CAPACITY, &windows, &[block]).is_err());
        let mut ringed = CpuKvCache::windowed(&pool, 2, 1, 4, CAPACITY, &windows).unwrap();
        assert!(ringed.share_block(&pool, 0).is_err());
    }
}
