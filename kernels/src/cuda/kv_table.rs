//! One sequence's block table on the CUDA side: the pool's device blocks
//! ([`KV_UNIT`] positions each) in position order, leased as positions are
//! written, and the rules of the backend trait's `kv_cache` and `kv_block`:
//! a prefix's blocks are read in place and never written again, and so is
//! a block handed out. A layout's block (1,024 positions by default) is a
//! run of device blocks, so a whole block and a tail of whole units are
//! both shared in place: nothing is ever copied.
//!
//! Only bookkeeping: the keys and values are written and read by
//! `attention.cu` through the ids this table lists.

use std::ops::Range;
use std::sync::Arc;

use super::kv_pool::{BlockLease, KvPool, KvShape};
use super::memory::DeviceMemory;
use crate::kv::{KvLayout, KvPrefix, KV_UNIT};
use crate::KernelError;

/// A block other caches can start from: the leases of its device blocks
/// and how many positions it holds.
pub struct SharedBlock<M: DeviceMemory> {
    leases: Vec<Arc<BlockLease<M>>>,
    positions: usize,
}

impl<M: DeviceMemory> Clone for SharedBlock<M> {
    fn clone(&self) -> Self {
        SharedBlock {
            leases: self.leases.clone(),
            positions: self.positions,
        }
    }
}

impl<M: DeviceMemory> SharedBlock<M> {
    /// Positions the block holds.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// The device block ids it is made of.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.leases.iter().map(|l| l.id())
    }
}

/// The blocks of one cache.
pub struct BlockTable<M: DeviceMemory> {
    pool: Arc<KvPool<M>>,
    units: Vec<Arc<BlockLease<M>>>,
    /// The layout's block (what `kv_block` hands out).
    block_positions: usize,
    capacity: usize,
    windowed: bool,
    /// Positions below this are in blocks other caches read: never written.
    frozen: usize,
    /// Positions written so far (a prefix's count as written).
    written: usize,
}

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

fn pool_err(e: super::CudaError) -> KernelError {
    match e {
        super::CudaError::Budget { bytes, .. } => KernelError::KvAlloc { bytes },
        other => KernelError::Device(other.to_string()),
    }
}

/// The pool shape of `layout`.
pub fn shape_of(layout: &KvLayout) -> KvShape {
    KvShape {
        layers: layout.layers(),
        n_kv_heads: layout.n_kv_heads(),
        head_dim: layout.head_dim(),
    }
}

impl<M: DeviceMemory> BlockTable<M> {
    /// A table for `layout` over `pool`, starting from `prefix`.
    pub fn new(
        pool: Arc<KvPool<M>>,
        layout: &KvLayout,
        prefix: KvPrefix<'_, SharedBlock<M>>,
    ) -> Result<Self, KernelError> {
        let err = |d: String| Err(shape_err("kv_cache", d));
        if pool.shape() != shape_of(layout) {
            return err(format!(
                "a pool of {:?} for a layout of {:?}",
                pool.shape(),
                shape_of(layout)
            ));
        }
        let block_positions = layout.block_positions();
        let mut table = BlockTable {
            pool,
            units: Vec::new(),
            block_positions,
            capacity: layout.capacity(),
            windowed: layout.windowed(),
            frozen: 0,
            written: 0,
        };
        let given = prefix.shared.len() + usize::from(prefix.tail.is_some());
        if table.windowed && given > 0 {
            return err(
                "a cache with sliding-window layers cannot start from shared blocks".into(),
            );
        }
        let tail = prefix.tail.map(|(b, n)| (b, n, n));
        let whole = prefix
            .shared
            .iter()
            .map(|b| (b, block_positions, b.positions));
        for (block, n, held) in whole.chain(tail) {
            let foreign = block
                .leases
                .iter()
                .any(|l| !Arc::ptr_eq(l.pool(), &table.pool));
            if foreign {
                return err("a prefix block of another model's KV shape".into());
            }
            let units = block.leases.get(..n / KV_UNIT);
            let fits = held >= n && n > 0 && n.is_multiple_of(KV_UNIT);
            let (Some(units), true) = (units, fits && block.positions <= block_positions) else {
                return err(format!(
                    "a prefix block of {} positions used for {n} (whole units of {KV_UNIT}, \
                     blocks of {block_positions})",
                    block.positions
                ));
            };
            table.units.extend(units.iter().cloned());
            table.written += n;
            if n < block_positions {
                break; // a tail ends the prefix
            }
        }
        table.frozen = table.written;
        if table.written > table.capacity {
            return err(format!(
                "a prefix of {} positions for a cache of {}",
                table.written, table.capacity
            ));
        }
        Ok(table)
    }

    pub fn pool(&self) -> &Arc<KvPool<M>> {
        &self.pool
    }

    /// Positions written (or given by the prefix).
    pub fn written(&self) -> usize {
        self.written
    }

    /// The device block ids in position order (the kernel's table row).
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.units.iter().map(|b| b.id())
    }

    /// Device blocks held.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Makes positions `range` writable: refuses those past the capacity
    /// or inside shared blocks, and leases the device blocks they need.
    /// The positions count as written from here on (the kernel writes them
    /// in the same step, before anything reads them).
    pub fn write(&mut self, range: Range<usize>) -> Result<(), KernelError> {
        if range.is_empty() {
            return Ok(());
        }
        if range.end > self.capacity {
            return Err(KernelError::KvCacheFull {
                capacity: self.capacity,
                position: range.end - 1,
            });
        }
        if range.start < self.frozen {
            return Err(shape_err(
                "attention",
                format!(
                    "position {} lies in a block shared with other caches (below {})",
                    range.start, self.frozen
                ),
            ));
        }
        let needed = range.end.div_ceil(KV_UNIT);
        while self.units.len() < needed {
            let lease = self.pool.lease().map_err(pool_err)?;
            self.units.push(Arc::new(lease));
        }
        self.written = self.written.max(range.end);
        Ok(())
    }

    /// Positions `positions` (from the start of one of the layout's
    /// blocks: all of it, or whole units) as a block other caches can
    /// start from, shared in place; this cache never writes them again.
    pub fn export(&mut self, positions: Range<usize>) -> Result<SharedBlock<M>, KernelError> {
        let bp = self.block_positions;
        let len = positions.len();
        let err = |why: &str| {
            Err(shape_err(
                "kv_block",
                format!("positions {positions:?}: {why}"),
            ))
        };
        if self.windowed {
            return err("a cache with sliding-window layers shares no block");
        }
        if !positions.start.is_multiple_of(bp) || len == 0 || len > bp {
            return err("not within one block from its start");
        }
        if !len.is_multiple_of(KV_UNIT) {
            return err("a partial block must be whole units of 32 positions");
        }
        if positions.end > self.written {
            return err("not yet written");
        }
        let Some(units) = self
            .units
            .get(positions.start / KV_UNIT..positions.end / KV_UNIT)
        else {
            return err("no such block");
        };
        let leases = units.to_vec();
        self.frozen = self.frozen.max(positions.end);
        Ok(SharedBlock {
            leases,
            positions: len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HostMemory;
    use super::*;
    use crate::kv::{KvFormat, KvType};

    fn layout(capacity: usize, windows: &[Option<usize>]) -> KvLayout {
        KvLayout::new(KvFormat::new(KvType::F16, 64), 2, 2, 64, capacity, windows).unwrap()
    }

    fn pool(mem: &HostMemory, blocks: usize) -> Arc<KvPool<HostMemory>> {
        let shape = KvShape {
            layers: 2,
            n_kv_heads: 2,
            head_dim: 64,
        };
        KvPool::new(mem, shape, blocks).unwrap()
    }

    fn ids<M: DeviceMemory>(t: &BlockTable<M>) -> Vec<u32> {
        t.ids().collect()
    }

    #[test]
    fn blocks_are_leased_as_positions_are_written() {
        let mem = HostMemory::new(1 << 22);
        let pool = pool(&mem, 8);
        let mut t = BlockTable::new(pool.clone(), &layout(200, &[]), KvPrefix::none()).unwrap();
        assert!(t.is_empty());
        t.write(0..10).unwrap();
        assert_eq!(ids(&t), vec![0]);
        t.write(10..65).unwrap();
        assert_eq!(ids(&t), vec![0, 1, 2]);
        assert_eq!(t.written(), 65);
        assert!(matches!(
            t.write(65..201),
            Err(KernelError::KvCacheFull {
                capacity: 200,
                position: 200
            })
        ));
        drop(t);
        assert_eq!(pool.free_blocks(), 8);
    }

    #[test]
    fn a_prefix_and_its_tail_are_read_in_place() {
        let mem = HostMemory::new(1 << 22);
        let pool = pool(&mem, 8);
        let l = layout(512, &[]);
        let mut first = BlockTable::new(pool.clone(), &l, KvPrefix::none()).unwrap();
        first.write(0..160).unwrap();
        assert_eq!(ids(&first), vec![0, 1, 2, 3, 4]);
        let whole = first.export(0..64).unwrap();
        let tail = first.export(128..160).unwrap();
        assert_eq!(whole.ids().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(tail.ids().collect::<Vec<_>>(), vec![4]);
        assert!(first.write(10..11).is_err(), "a handed-out block is frozen");
        assert!(first.write(159..161).is_err());
        assert!(first.export(64..100).is_err(), "not whole units");
        assert!(first.export(32..64).is_err(), "not from a block's start");
        assert!(first.export(192..224).is_err(), "not yet written");

        let mut second = BlockTable::new(
            pool.clone(),
            &l,
            KvPrefix {
                shared: std::slice::from_ref(&whole),
                tail: Some((&tail, 32)),
            },
        )
        .unwrap();
        assert_eq!(second.written(), 96);
        assert_eq!(ids(&second), vec![0, 1, 4]);
        assert!(second.write(95..96).is_err());
        second.write(96..97).unwrap();
        assert_eq!(ids(&second), vec![0, 1, 4, 5]);

        // A block lives while one holder does.
        drop(first);
        assert_eq!(pool.free_blocks(), 8 - 4, "blocks 0, 1, 4 (shared) and 5");
        drop((whole, tail));
        assert_eq!(pool.free_blocks(), 4);
        drop(second);
        assert_eq!(pool.free_blocks(), 8);
    }

    #[test]
    fn foreign_short_and_windowed_prefixes_are_refused() {
        let mem = HostMemory::new(1 << 23);
        let (a, b) = (pool(&mem, 4), pool(&mem, 4));
        let l = layout(512, &[]);
        let mut t = BlockTable::new(a.clone(), &l, KvPrefix::none()).unwrap();
        t.write(0..64).unwrap();
        let block = t.export(0..64).unwrap();
        let start = |p: &Arc<KvPool<HostMemory>>, l: &KvLayout, tail: usize| {
            BlockTable::new(
                p.clone(),
                l,
                KvPrefix {
                    shared: &[],
                    tail: Some((&block, tail)),
                },
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        assert!(start(&b, &l, 32).contains("another model"));
        assert!(start(&a, &l, 96).contains("64 positions used for 96"));
        assert!(start(&a, &l, 40).contains("used for 40"));
        assert!(start(&a, &layout(512, &[Some(100)]), 32).contains("sliding-window"));
        assert_eq!(start(&a, &l, 32), "");
        let mut w =
            BlockTable::new(a.clone(), &layout(512, &[Some(100)]), KvPrefix::none()).unwrap();
        w.write(0..64).unwrap();
        assert!(w.export(0..64).is_err());
    }

    #[test]
    fn an_empty_pool_is_a_kv_alloc_error() {
        let mem = HostMemory::new(1 << 22);
        let pool = pool(&mem, 1);
        let mut t = BlockTable::new(pool, &layout(512, &[]), KvPrefix::none()).unwrap();
        assert!(matches!(t.write(0..33), Err(KernelError::KvAlloc { .. })));
    }
}
