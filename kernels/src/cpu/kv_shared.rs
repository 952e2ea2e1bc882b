//! KV blocks shared between caches: the prompt cache's unit.
//!
//! A sequence whose prompt filled block `b` in every layer can hand that
//! block out ([`CpuKvCache::share_block`]): the block becomes
//! [`Block::Shared`] in its cache (it is never written again: later
//! positions go to later blocks) and a [`CpuKvBlock`] handle keeps its
//! memory after the sequence ends, for as long as some handle lives (the
//! engine's `kv` module counts its bytes against the budget meanwhile). A
//! later cache starts from such blocks ([`CpuKvCache::with_prefix`]),
//! allocating only its own blocks beyond them.
//!
//! A prompt rarely ends on a block boundary, and with blocks of 1,024
//! positions most of a shared system prompt would lie in the partial last
//! block. So the written key blocks of that block are copied into a
//! shorter block of their own ([`CpuKvCache::copy_tail`]), and a later
//! cache copies the key blocks its prompt has in common with such a block
//! (or with a full one) into its own next block: a copy of a few MB instead
//! of recomputing hundreds of positions.
//!
//! Sliding-window layers keep rings whose blocks are overwritten as the
//! window moves, so a cache with one cannot share or take shared blocks.

use std::sync::Arc;

use super::kv_cache::{Block, CpuKvCache, Stored, KEY_BLOCK};
use super::kv_q8::Q8Byte;
use super::kv_shared_block::{CpuKvBlock, Layers, Shared};
use crate::kv::{KvLayout, KvPrefix, KvType};
use crate::KernelError;

use half::f16;

fn refuse(detail: String) -> KernelError {
    KernelError::Shape {
        op: "kv_share",
        detail,
    }
}

/// Copies the first `key_blocks` key blocks of every head's run from
/// `from` (runs of `from_blocks` key blocks) to the start of the runs of
/// `to` (of `to_blocks`); `None` where a run does not fit.
fn copy_runs<E: Copy>(
    (from, from_blocks): (&[E], usize),
    (to, to_blocks): (&mut [E], usize),
    key_blocks: usize,
    heads: usize,
    run_len: usize,
) -> Option<()> {
    let len = key_blocks * run_len;
    for head in 0..heads {
        let src = from.get(head * from_blocks * run_len..)?.get(..len)?;
        let dst = to.get_mut(head * to_blocks * run_len..)?.get_mut(..len)?;
        dst.copy_from_slice(src);
    }
    Some(())
}

impl CpuKvCache {
    /// Positions `range` as a block of their own (see
    /// [`crate::Backend::kv_block`]): a whole block shared in place, a
    /// shorter run from a block's start copied.
    pub(crate) fn export(
        &mut self,
        range: std::ops::Range<usize>,
    ) -> Result<CpuKvBlock, KernelError> {
        let positions = self.block_positions();
        if range.len() == positions && range.start.is_multiple_of(positions) {
            self.share_block(range.start / positions)
        } else {
            self.copy_tail(range.start, range.len())
        }
    }

    /// Shares block `block` (positions `block * block_positions..`, written in
    /// every layer).
    pub(crate) fn share_block(&mut self, block: usize) -> Result<CpuKvBlock, KernelError> {
        if let Some(held) = self.prefix.get(block) {
            return Ok(held.clone());
        }
        self.check_shareable()?;
        let positions = self.block_positions();
        let end = (block + 1) * positions;
        if self.filled.iter().any(|f| *f < end) {
            return Err(refuse(format!(
                "block {block} is not written in every layer (positions up to {end})"
            )));
        }
        let layers = match self.dtype() {
            KvType::F32 => self.share_layers::<f32>(block),
            KvType::F16 => self.share_layers::<f16>(block),
            KvType::Q8_0 => self.share_layers::<Q8Byte>(block),
        }
        .ok_or_else(|| refuse(format!("block {block} is not allocated in every layer")))?;
        let block = self.handle(layers, positions)?;
        self.shared_end = self.shared_end.max(end);
        Ok(block)
    }

    /// Copies positions `start..start + positions` (`start` where one of
    /// its blocks begins, `positions` whole key blocks, written in every
    /// layer) into a block of that length of their own: the written part of a prompt's last block, for
    /// later caches to copy from (see the module documentation).
    pub(crate) fn copy_tail(
        &mut self,
        start: usize,
        positions: usize,
    ) -> Result<CpuKvBlock, KernelError> {
        self.check_windowless()?;
        let block = self.block_positions();
        if !start.is_multiple_of(block)
            || positions == 0
            || !positions.is_multiple_of(KEY_BLOCK)
            || positions > block
        {
            return Err(refuse(format!(
                "a tail of {positions} positions at {start} is not whole key blocks \
                 from the start of a block of {block}"
            )));
        }
        if self.filled.iter().any(|f| *f < start + positions) {
            return Err(refuse(format!(
                "positions up to {} are not written in every layer",
                start + positions
            )));
        }
        let layers = match self.dtype() {
            KvType::F32 => self.copy_layers::<f32>(start / block, positions),
            KvType::F16 => self.copy_layers::<f16>(start / block, positions),
            KvType::Q8_0 => self.copy_layers::<Q8Byte>(start / block, positions),
        }
        .ok_or_else(|| {
            refuse(format!(
                "the block at {start} is not allocated in every layer"
            ))
        })?;
        self.handle(layers, positions)
    }

    fn check_windowless(&self) -> Result<(), KernelError> {
        if (0..self.layers()).any(|l| self.window(l).is_some()) {
            return Err(refuse(
                "a cache with sliding-window layers cannot share blocks".into(),
            ));
        }
        Ok(())
    }

    fn check_shareable(&self) -> Result<(), KernelError> {
        self.check_windowless()?;
        if !self.layout().full_blocks() {
            return Err(refuse(format!(
                "a cache of {} positions has blocks of its length, not the format's",
                self.capacity(),
            )));
        }
        Ok(())
    }

    /// Block `block` of every layer, made shared.
    fn share_layers<E: Stored>(&mut self, block: usize) -> Option<Layers> {
        let layers = E::layers(&mut self.store)?;
        let shared = layers
            .iter_mut()
            .map(|blocks| blocks.get_mut(block).map(Block::share))
            .collect::<Option<Vec<_>>>()?;
        Some(E::to_shared(shared))
    }

    /// The first `positions` of block `block` of every layer, copied: each
    /// head's first key blocks, one head after the other.
    fn copy_layers<E: Stored>(&mut self, block: usize, positions: usize) -> Option<Layers> {
        let (heads, run_len) = (self.n_kv_heads(), E::run_len(self.head_dim()));
        let from_blocks = self.key_blocks();
        let len = positions / KEY_BLOCK * run_len;
        let layers = E::layers(&mut self.store)?;
        let copied = layers
            .iter()
            .map(|blocks| {
                let from = blocks.get(block)?.elems();
                let mut to = Vec::with_capacity(heads * len);
                for head in 0..heads {
                    to.extend_from_slice(from.get(head * from_blocks * run_len..)?.get(..len)?);
                }
                Some(Arc::new(to))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(E::to_shared(copied))
    }

    /// A handle to `layers` (blocks of `positions`).
    fn handle(&self, layers: Layers, positions: usize) -> Result<CpuKvBlock, KernelError> {
        let (n_kv_heads, head_dim) = (self.n_kv_heads(), self.head_dim());
        let bytes = self
            .layout()
            .shared_bytes(positions)
            .ok_or_else(|| refuse("the block's size overflows".into()))?;
        Ok(CpuKvBlock(Arc::new(Shared {
            layers,
            n_kv_heads,
            head_dim,
            positions,
            bytes,
        })))
    }

    /// A cache of `capacity` positions that starts from `prefix`: its
    /// shared blocks read in place (already written, never written again),
    /// then the first positions of its tail copied into the cache's own
    /// next block. The sequence goes on from the end of both. Allocates
    /// only the blocks beyond the shared ones.
    pub(crate) fn with_prefix(
        layout: &KvLayout,
        prefix: KvPrefix<'_, CpuKvBlock>,
    ) -> Result<Self, KernelError> {
        if prefix.shared.is_empty() && prefix.tail.is_none() {
            return Ok(Self::empty(layout));
        }
        let (layers, n_kv_heads, head_dim) =
            (layout.layers(), layout.n_kv_heads(), layout.head_dim());
        let capacity = layout.capacity();
        let block_positions = layout.block_positions();
        if layout.windowed() {
            return Err(refuse(
                "a cache with sliding-window layers cannot start from shared blocks".into(),
            ));
        }
        let end = prefix.shared.len() * block_positions;
        let copied = prefix.tail.map_or(0, |(_, n)| n);
        if end + copied >= capacity {
            return Err(refuse(format!(
                "a cached prefix of {} positions leaves no room in a cache of {capacity}",
                end + copied
            )));
        }
        let shaped = |b: &CpuKvBlock| {
            let typed = match (&b.0.layers, layout.dtype()) {
                (Layers::F32(l), KvType::F32) => Some(l.len()),
                (Layers::F16(l), KvType::F16) => Some(l.len()),
                (Layers::Q8_0(l), KvType::Q8_0) => Some(l.len()),
                _ => None,
            };
            typed == Some(layers) && b.0.n_kv_heads == n_kv_heads && b.0.head_dim == head_dim
        };
        let full = |b: &CpuKvBlock| shaped(b) && b.0.positions == block_positions;
        if !prefix.shared.iter().all(full) {
            return Err(refuse(
                "a shared block's type or shape differs from the cache's".into(),
            ));
        }
        if let Some((tail, n)) = prefix.tail {
            if !shaped(tail) || n == 0 || !n.is_multiple_of(KEY_BLOCK) || n > tail.0.positions {
                return Err(refuse(format!(
                    "{n} positions of a cached tail of {} do not fit the cache",
                    tail.0.positions
                )));
            }
        }
        if !prefix.shared.is_empty() && !layout.full_blocks() {
            return Err(refuse(
                "a cache shorter than a block cannot start from shared blocks".into(),
            ));
        }
        let mut cache = Self::empty(layout);
        let taken = match layout.dtype() {
            KvType::F32 => cache.take_prefix::<f32>(&prefix),
            KvType::F16 => cache.take_prefix::<f16>(&prefix),
            KvType::Q8_0 => cache.take_prefix::<Q8Byte>(&prefix),
        };
        taken.ok_or_else(|| refuse("a cached block does not fit the cache".into()))??;
        cache.filled.iter_mut().for_each(|f| *f = end + copied);
        cache.prefix = prefix.shared.to_vec();
        Ok(cache)
    }

    /// Pushes `prefix`'s shared blocks onto every layer, then copies its
    /// tail into the next block (allocated here); `None` where a block's
    /// type or size does not fit (checked by the caller).
    fn take_prefix<E: Stored>(
        &mut self,
        prefix: &KvPrefix<'_, CpuKvBlock>,
    ) -> Option<Result<(), KernelError>> {
        let (heads, run_len) = (self.n_kv_heads(), E::run_len(self.head_dim()));
        let to_blocks = self.key_blocks();
        let end = prefix.shared.len() * self.block_positions();
        for l in 0..self.layers() {
            let mine = E::layers(&mut self.store)?.get_mut(l)?;
            for block in prefix.shared {
                mine.push(Block::Shared(Arc::clone(
                    E::shared(&block.0.layers)?.get(l)?,
                )));
            }
            let Some((tail, n)) = prefix.tail else {
                continue;
            };
            if let Err(e) = self.ensure::<E>(l, end + n) {
                return Some(Err(e));
            }
            let from = E::shared(&tail.0.layers)?.get(l)?;
            let Block::Own(to) = E::layers(&mut self.store)?.get_mut(l)?.last_mut()? else {
                return None;
            };
            let from_blocks = tail.0.positions / KEY_BLOCK;
            copy_runs(
                (from, from_blocks),
                (to, to_blocks),
                n / KEY_BLOCK,
                heads,
                run_len,
            )?;
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvFormat;

    /// Positions per block: two key blocks, so that a block's runs hold
    /// more than one.
    const BLOCK: usize = 64;

    /// Positions of the tests' caches: a few blocks.
    const CAPACITY: usize = 4 * BLOCK;

    fn shared(blocks: &[CpuKvBlock]) -> KvPrefix<'_, CpuKvBlock> {
        KvPrefix {
            shared: blocks,
            tail: None,
        }
    }

    fn layout(
        format: &KvFormat,
        layers: usize,
        heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
    ) -> KvLayout {
        KvLayout::new(*format, layers, heads, head_dim, capacity, windows).unwrap()
    }

    fn filled_cache(pool: &KvFormat, positions: usize) -> CpuKvCache {
        filled_cache_of(pool, CAPACITY, positions)
    }

    fn filled_cache_of(pool: &KvFormat, capacity: usize, positions: usize) -> CpuKvCache {
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
        let pool = KvFormat::new(KvType::F32, BLOCK);
        let mut first = filled_cache(&pool, 2 * BLOCK + 6);
        let blocks: Vec<_> = (0..2).map(|b| first.share_block(b).unwrap()).collect();
        assert!(first.share_block(2).is_err(), "block 2 is half written");
        let mut second =
            CpuKvCache::with_prefix(&layout(&pool, 2, 1, 4, CAPACITY, &[]), shared(&blocks))
                .unwrap();
        assert_eq!(second.len(0), 2 * BLOCK);
        // A shared block is what the layout counts for it.
        let own = first.layout().bytes_beyond(0);
        assert_eq!(second.layout().bytes_beyond(2), own - 2 * blocks[0].bytes());
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
    fn a_copied_tail_starts_a_cache_from_its_positions_in_an_own_block() {
        let pool = KvFormat::new(KvType::F32, BLOCK);
        // Block 1 holds 40 written positions: one whole key block.
        let mut first = filled_cache(&pool, BLOCK + 40);
        let head = first.share_block(0).unwrap();
        assert!(first.copy_tail(BLOCK, 64).is_err(), "not written");
        assert!(first.copy_tail(BLOCK, 16).is_err(), "half a key block");
        assert!(
            first.copy_tail(BLOCK + 32, 32).is_err(),
            "not a block start"
        );
        let tail = first.copy_tail(BLOCK, 32).unwrap();
        // 2 layers × keys and values × 32 positions × 4 dims × 4 bytes.
        assert_eq!(tail.bytes(), 2 * 2 * 32 * 4 * 4);
        let prefix = KvPrefix {
            shared: std::slice::from_ref(&head),
            tail: Some((&tail, 32)),
        };
        let mut second =
            CpuKvCache::with_prefix(&layout(&pool, 2, 1, 4, CAPACITY, &[]), prefix).unwrap();
        assert_eq!(second.len(1), BLOCK + 32);
        // Its own blocks, the shared one not.
        assert_eq!(second.layout().bytes_beyond(1), 3 * head.bytes());
        for layer in 0..2 {
            for p in [0, BLOCK - 1, BLOCK, BLOCK + 17, BLOCK + 31] {
                assert_eq!(second.key(layer, 0, p), first.key(layer, 0, p));
                assert_eq!(second.value(layer, 0, p), first.value(layer, 0, p));
            }
        }
        // The copied positions are the cache's own: it may write them.
        assert!(second.check_writable(BLOCK).is_ok());
        second.write::<f32>(0, BLOCK, &[9.0; 4], &[9.0; 4]).unwrap();
        assert_ne!(first.key(0, 0, BLOCK), second.key(0, 0, BLOCK));
        // A full shared block serves as a tail too: its first key block.
        let prefix = KvPrefix {
            shared: &[],
            tail: Some((&head, 32)),
        };
        let mut third =
            CpuKvCache::with_prefix(&layout(&pool, 2, 1, 4, CAPACITY, &[]), prefix).unwrap();
        assert_eq!(third.len(0), 32);
        assert_eq!(third.key(1, 0, 31), first.key(1, 0, 31));
        assert_eq!(third.value(1, 0, 20), first.value(1, 0, 20));
        for n in [0, 16, 64] {
            let prefix = KvPrefix {
                shared: &[],
                tail: Some((&tail, n)),
            };
            let taken = CpuKvCache::with_prefix(&layout(&pool, 2, 1, 4, CAPACITY, &[]), prefix);
            assert!(taken.is_err(), "{n} positions of a tail of 32");
        }
    }

    #[test]
    fn a_short_cache_copies_its_tail_and_a_longer_one_takes_it_up() {
        let (layers, head_dim) = (2, 64);
        for dtype in [KvType::F16, KvType::Q8_0] {
            let pool = KvFormat::new(dtype, 4 * BLOCK);
            let row = |p: usize, sign: f32| -> Vec<f32> {
                (0..head_dim)
                    .map(|d| sign * (p * 7 + d) as f32 / 13.0)
                    .collect()
            };
            // Shorter than a block: a block of its own length (96).
            let mut short = CpuKvCache::windowed(&pool, layers, 2, head_dim, 90, &[]).unwrap();
            for layer in 0..layers {
                let heads: Vec<f32> = [row(0, 1.0), row(0, 2.0)].concat();
                match dtype {
                    KvType::F16 => short.ensure::<f16>(layer, 70).unwrap(),
                    _ => short.ensure::<Q8Byte>(layer, 70).unwrap(),
                }
                for p in 0..70 {
                    let key: Vec<f32> = [row(p, 1.0), row(p, 2.0)].concat();
                    let value: Vec<f32> = [row(p, -1.0), heads.clone()].concat();
                    match dtype {
                        KvType::F16 => short.write::<f16>(layer, p, &key, &value).unwrap(),
                        _ => short.write::<Q8Byte>(layer, p, &key, &value).unwrap(),
                    }
                }
                short.set_len(layer, 70);
            }
            let tail = short.copy_tail(0, 64).unwrap();
            let prefix = KvPrefix {
                shared: &[],
                tail: Some((&tail, 64)),
            };
            let mut long =
                CpuKvCache::with_prefix(&layout(&pool, layers, 2, head_dim, CAPACITY, &[]), prefix)
                    .unwrap();
            assert_eq!(long.block_positions(), 4 * BLOCK);
            for layer in 0..layers {
                for head in 0..2 {
                    for p in [0, 31, 32, 63] {
                        let what = format!("{dtype} layer {layer} head {head} position {p}");
                        assert_eq!(
                            long.key(layer, head, p),
                            short.key(layer, head, p),
                            "{what}"
                        );
                        assert_eq!(
                            long.value(layer, head, p),
                            short.value(layer, head, p),
                            "{what}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_blocks_are_shared_at_their_own_size() {
        use crate::cpu::kv_q8::{round_q8, Q8Byte};
        let (layers, head_dim) = (2, 64);
        let pool = KvFormat::new(KvType::Q8_0, BLOCK);
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
        let block = first.share_block(0).unwrap();
        // 34 bytes per 32 keys and values of every layer.
        assert_eq!(block.bytes(), layers * 2 * BLOCK * head_dim / 32 * 34);
        let mut second = CpuKvCache::with_prefix(
            &layout(&pool, layers, 1, head_dim, CAPACITY, &[]),
            shared(&[block]),
        )
        .unwrap();
        for p in [0, 17, 31, 40, BLOCK - 1] {
            assert_eq!(second.key(1, 0, p), round_q8(&row(p, 1.0)));
            assert_eq!(second.value(1, 0, p), round_q8(&row(p, -1.0)));
        }
        let f32_pool = KvFormat::new(KvType::F32, BLOCK);
        let other = CpuKvCache::with_prefix(
            &layout(&f32_pool, layers, 1, head_dim, CAPACITY, &[]),
            shared(&second.prefix),
        );
        assert!(other.is_err(), "a q8_0 block taken up by an f32 cache");
    }

    #[test]
    fn a_cache_shorter_than_a_block_holds_its_length_and_shares_nothing() {
        let pool = KvFormat::new(KvType::F32, 4 * BLOCK);
        let mut short = filled_cache_of(&pool, BLOCK + 3, BLOCK + 3);
        // Its capacity in whole key blocks: 96 positions, not 256.
        assert_eq!(short.block_positions(), BLOCK + 32);
        // 2 layers × keys and values × 96 positions × 4 dims × 4 bytes.
        assert_eq!(short.allocated_bytes(), 2 * 2 * (BLOCK + 32) * 4 * 4);
        assert!(short.share_block(0).is_err());
    }

    #[test]
    fn windowed_caches_neither_share_nor_take_shared_blocks() {
        let pool = KvFormat::new(KvType::F32, BLOCK);
        let mut first = filled_cache(&pool, BLOCK + 8);
        let block = first.share_block(0).unwrap();
        let windows = [Some(16), None];
        let from_shared = CpuKvCache::with_prefix(
            &layout(&pool, 2, 1, 4, CAPACITY, &windows),
            shared(&[block]),
        );
        assert!(from_shared.is_err());
        let mut ringed = CpuKvCache::windowed(&pool, 2, 1, 4, CAPACITY, &windows).unwrap();
        assert!(ringed.share_block(0).is_err());
    }
}
