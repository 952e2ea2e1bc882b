//! The CUDA backend's KV store: the engine's blocks by [`BlockId`], each a
//! run of device units of [`KV_UNIT`] positions in a [`KvPool`], and the
//! unit tables attention launches read.
//!
//! The engine allocates, frees and copies blocks and builds each
//! sequence's [`BlockTable`] (a ring for a sliding-window layer); this
//! store turns a table into what `attention.cu` takes: per sequence, the
//! unit holding each run of 32 positions from 0 to the step's last, ring
//! wraps resolved on the host. Pools are made at the first block of a
//! head shape, from the store's budget (or 80% of the device's free
//! memory when the budget is larger), so weights loaded first are not
//! crowded out.

use std::collections::HashMap;
use std::sync::Arc;

use super::kv_pool::{KvPool, KvShape, UnitLease};
use super::memory::DeviceMemory;
use super::CudaError;
use crate::kv::{BlockId, BlockTable, KvBlockShape, KvFormat, KvType, KV_UNIT};
use crate::KernelError;

/// Share of the free device memory a pool takes at most: the rest is for
/// activations, scratch and cuBLAS.
const SHARE_OF_FREE: f64 = 0.8;

struct Stored<M: DeviceMemory> {
    shape: KvBlockShape,
    units: Vec<UnitLease<M>>,
}

/// The store; see the module documentation.
pub struct KvUnits<M: DeviceMemory> {
    memory: M,
    /// Bytes the pools may still take.
    budget_left: usize,
    pools: Vec<Arc<KvPool<M>>>,
    blocks: HashMap<u32, Stored<M>>,
    next: u32,
    free_ids: Vec<u32>,
}

fn refuse(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

fn pool_err(e: CudaError) -> KernelError {
    match e {
        CudaError::Budget { bytes, .. } | CudaError::OutOfMemory { bytes, .. } => {
            KernelError::KvAlloc { bytes }
        }
        other => KernelError::Device(other.to_string()),
    }
}

/// The units of the sequences of one launch.
pub struct UnitTables<M: DeviceMemory> {
    pub pool: Arc<KvPool<M>>,
    /// Per sequence, the unit of positions `32u..32u + 32` at index `u`.
    pub units: Vec<Vec<u32>>,
}

impl<M: DeviceMemory> KvUnits<M> {
    /// An empty store for `format` of at most `budget_bytes`: F16 only
    /// (the kernels' element type).
    pub fn new(memory: M, format: KvFormat, budget_bytes: usize) -> Result<Self, KernelError> {
        if format.dtype != KvType::F16 {
            return Err(refuse(
                "kv_store",
                format!(
                    "the CUDA backend stores keys and values as f16, not {}: use --kv-type f16",
                    format.dtype
                ),
            ));
        }
        Ok(KvUnits {
            memory,
            budget_left: budget_bytes,
            pools: Vec::new(),
            blocks: HashMap::new(),
            next: 0,
            free_ids: Vec::new(),
        })
    }

    fn pool_for(&mut self, shape: KvShape) -> Result<Arc<KvPool<M>>, KernelError> {
        if let Some(pool) = self.pools.iter().find(|p| p.shape() == shape) {
            return Ok(Arc::clone(pool));
        }
        let room = (self.memory.free_bytes() as f64 * SHARE_OF_FREE) as usize;
        let bytes = self.budget_left.min(room);
        let units = bytes / shape.unit_bytes().max(1);
        if units == 0 {
            return Err(KernelError::KvAlloc {
                bytes: shape.unit_bytes(),
            });
        }
        let pool = KvPool::new(self.memory.clone(), shape, units).map_err(pool_err)?;
        self.budget_left -= units * shape.unit_bytes();
        tracing::info!(
            "cuda: a KV pool of {units} units of 32 positions ({:.2} GiB) for {shape:?}",
            (units * shape.unit_bytes()) as f64 / f64::from(1u32 << 30)
        );
        self.pools.push(Arc::clone(&pool));
        Ok(pool)
    }

    /// A block of `shape`: its units leased (zeroed when the pool was made;
    /// a reused unit holds old keys, which no position reads before it is
    /// written).
    pub fn alloc(&mut self, shape: KvBlockShape) -> Result<BlockId, KernelError> {
        if shape.dtype != KvType::F16
            || shape.positions == 0
            || !shape.positions.is_multiple_of(KV_UNIT)
        {
            return Err(refuse(
                "kv_alloc",
                format!("a block {shape:?}: f16, whole units of {KV_UNIT} positions"),
            ));
        }
        let pool = self.pool_for(KvShape {
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
        })?;
        let units = (0..shape.positions / KV_UNIT)
            .map(|_| pool.lease())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pool_err)?;
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                self.next += 1;
                self.next - 1
            }
        };
        self.blocks.insert(id, Stored { shape, units });
        Ok(BlockId(id))
    }

    /// Frees block `id` (an unknown id is ignored).
    pub fn free(&mut self, id: BlockId) {
        if self.blocks.remove(&id.0).is_some() {
            self.free_ids.push(id.0);
        }
    }

    /// Copies the first `positions` (whole units) of `from` to the start of `to`.
    pub fn copy(
        &mut self,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        let (a, b) = (self.blocks.get(&from.0), self.blocks.get(&to.0));
        let (Some(a), Some(b)) = (a, b) else {
            return Err(refuse(
                "kv_copy",
                format!("no block {from:?} or {to:?} in the store"),
            ));
        };
        let fits = from != to
            && a.shape.n_kv_heads == b.shape.n_kv_heads
            && a.shape.head_dim == b.shape.head_dim
            && positions.is_multiple_of(KV_UNIT)
            && positions <= a.shape.positions.min(b.shape.positions);
        if !fits {
            return Err(refuse(
                "kv_copy",
                format!(
                    "{positions} positions of a block {:?} into a block {:?}",
                    a.shape, b.shape
                ),
            ));
        }
        for (src, dst) in a.units.iter().zip(&b.units).take(positions / KV_UNIT) {
            src.pool().copy(src.id(), dst.id()).map_err(pool_err)?;
        }
        Ok(())
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The units of layer `layer` of each `(table, end)`, positions
    /// `0..end`: fails where a table lacks a block those positions land
    /// in, a block is not this store's, or the sequences' heads differ.
    pub fn unit_tables(
        &self,
        layer: usize,
        seqs: &[(&BlockTable, usize)],
    ) -> Result<UnitTables<M>, KernelError> {
        let err = |d: String| Err(refuse("attention", d));
        let mut pool: Option<Arc<KvPool<M>>> = None;
        let mut units = Vec::with_capacity(seqs.len());
        for (s, (table, end)) in seqs.iter().enumerate() {
            let layout = table.layout();
            let bp = layout.block_positions();
            let ids = table.layer(layer);
            let mut row = Vec::with_capacity(end.div_ceil(KV_UNIT));
            for u in 0..end.div_ceil(KV_UNIT) {
                let p = u * KV_UNIT;
                let index = table.index_of(layer, p);
                let Some(id) = ids.get(index) else {
                    return err(format!(
                        "sequence {s}'s table has no block {index} of layer {layer} for position {p}"
                    ));
                };
                let Some(block) = self.blocks.get(&id.0) else {
                    return err(format!("sequence {s} names {id:?}, not in the store"));
                };
                let Some(unit) = block.units.get((p % bp) / KV_UNIT) else {
                    return err(format!(
                        "{id:?} of {} positions in a table of {bp}-position blocks",
                        block.shape.positions
                    ));
                };
                match &pool {
                    Some(p) if !Arc::ptr_eq(p, unit.pool()) => {
                        return err("sequences of different KV head shapes in one call".into())
                    }
                    Some(_) => {}
                    None => pool = Some(Arc::clone(unit.pool())),
                }
                row.push(unit.id());
            }
            units.push(row);
        }
        match pool {
            Some(pool) => Ok(UnitTables { pool, units }),
            None => err("no positions to attend".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HostMemory;
    use super::*;
    use crate::kv::KvLayout;

    fn shape(positions: usize) -> KvBlockShape {
        KvBlockShape {
            dtype: KvType::F16,
            n_kv_heads: 2,
            head_dim: 64,
            positions,
        }
    }

    fn store(mem: &HostMemory, budget: usize) -> KvUnits<HostMemory> {
        KvUnits::new(mem.clone(), KvFormat::new(KvType::F16, 64), budget).unwrap()
    }

    /// 32 positions of 2 heads of 64 in F16, K and V.
    const UNIT: usize = 2 * 32 * 64 * 2 * 2;

    #[test]
    fn blocks_are_runs_of_units_freed_and_copied_by_id() {
        let mem = HostMemory::new(1 << 22);
        let mut s = store(&mem, 8 * UNIT);
        let a = s.alloc(shape(64)).unwrap();
        let b = s.alloc(shape(64)).unwrap();
        assert_eq!((a, b), (BlockId(0), BlockId(1)));
        // The pool took the budget at once.
        assert_eq!(mem.used(), 8 * UNIT);
        let pool = Arc::clone(&s.pools[0]);
        assert_eq!(pool.free_units(), 4);
        let unit_of =
            |s: &KvUnits<HostMemory>, id: BlockId, i: usize| s.blocks[&id.0].units[i].id();
        let at = |unit: u32| pool.address() + (unit as usize * UNIT) as u64;
        mem.write_at(at(unit_of(&s, a, 1)) + 5, &[7]).unwrap();
        s.copy(a, b, 64).unwrap();
        assert_eq!(mem.read_at(at(unit_of(&s, b, 1)) + 5, 1), Some(vec![7]));
        assert!(s.copy(a, b, 40).is_err(), "not whole units");
        assert!(s.copy(a, a, 32).is_err());
        assert!(s.copy(a, BlockId(9), 32).is_err());
        s.free(a);
        s.free(a);
        assert_eq!(s.len(), 1);
        assert_eq!(s.pools[0].free_units(), 6);
        assert_eq!(s.alloc(shape(32)).unwrap(), BlockId(0), "ids are reused");
        assert!(matches!(
            s.alloc(shape(256)),
            Err(KernelError::KvAlloc { .. })
        ));
        assert!(s.alloc(shape(48)).is_err());
    }

    #[test]
    fn tables_become_units_per_position_with_rings_resolved() {
        let mem = HostMemory::new(1 << 24);
        let mut s = store(&mem, usize::MAX);
        let format = KvFormat::new(KvType::F16, 64);
        // Layer 0 keeps every position; layer 1 a window of 40, a ring of
        // ceil((40 + 128) / 64) = 3 blocks.
        let layout = KvLayout::new(format, 2, 2, 64, 512, &[None, Some(40)]).unwrap();
        assert_eq!(layout.max_blocks(1), 3);
        let mut table = BlockTable::new(layout.clone());
        for layer in 0..2 {
            for _ in 0..layout.max_blocks(layer).min(4) {
                let id = s.alloc(shape(64)).unwrap();
                table.push(layer, id).unwrap();
            }
        }
        let units = |s: &KvUnits<HostMemory>, layer: usize, i: usize| -> Vec<u32> {
            let id = table.layer(layer)[i];
            s.blocks[&id.0].units.iter().map(|u| u.id()).collect()
        };
        let t = s.unit_tables(0, &[(&table, 250)]).unwrap();
        let expected: Vec<u32> = (0..4).flat_map(|i| units(&s, 0, i)).collect();
        assert_eq!(t.units, vec![expected]);
        // Layer 1: positions 192..250 wrap to the ring's first block.
        let t = s.unit_tables(1, &[(&table, 250)]).unwrap();
        let ring: Vec<u32> = (0..3).flat_map(|i| units(&s, 1, i)).collect();
        let mut expected = ring.clone();
        expected.extend(&ring[..2]);
        assert_eq!(t.units, vec![expected]);
        // Past the blocks the table holds.
        let e = s
            .unit_tables(0, &[(&table, 257)])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no block 4 of layer 0"), "{e}");
        // Another head shape in the same call.
        let mut other = BlockTable::new(KvLayout::new(format, 1, 4, 64, 64, &[]).unwrap());
        let id = s
            .alloc(KvBlockShape {
                n_kv_heads: 4,
                ..shape(64)
            })
            .unwrap();
        other.push(0, id).unwrap();
        let e = s
            .unit_tables(0, &[(&table, 10), (&other, 10)])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("different KV head shapes"), "{e}");
    }

    #[test]
    fn only_f16_is_stored() {
        let mem = HostMemory::new(1 << 20);
        let e = KvUnits::new(mem, KvFormat::new(KvType::Q8_0, 64), 1 << 20)
            .err()
            .unwrap();
        assert!(e.to_string().contains("use --kv-type f16"), "{e}");
    }
}
