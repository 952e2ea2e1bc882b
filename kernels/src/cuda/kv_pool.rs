//! The device's KV blocks: one allocation per model shape, cut into blocks
//! of [`KV_UNIT`] positions that the caches' block tables name by number
//! (`attention.cu` reads a block as `pool + id · block size`).
//!
//! Device blocks are the unit every layout's block is a whole number of,
//! not the layout's own (1,024 positions by default; a short cache's is
//! shorter): caches of every length share one pool and one launch, and a
//! block handed to another cache, whole or a run of units, is shared in
//! place, never copied.
//!
//! The pool is laid out `[layer][block]`, each block `[K | V]`, each half
//! `[kv_head][position][head_dim]` in F16, so a layer's pool is one base
//! address and a block id means the same block in every layer. A
//! [`BlockLease`] holds one id; the id returns to the free list when its
//! last lease drops, so a block shared by several caches and the prompt
//! cache lives as long as one of them holds it. How many blocks a pool has
//! is the backend's KV budget, fixed when the pool is made: which caches
//! may take them is the engine's policy.

use std::sync::{Arc, Mutex};

use super::memory::DeviceMemory;
use super::CudaError;
use crate::kv::KV_UNIT;

/// The shape every block of a pool has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvShape {
    pub layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Positions of a device block.
    pub const BLOCK_POSITIONS: usize = KV_UNIT;

    /// F16 elements of one half (K or V) of one layer's block.
    pub fn half_elems(&self) -> usize {
        self.n_kv_heads * Self::BLOCK_POSITIONS * self.head_dim
    }

    /// Bytes of one layer's block (K and V, F16).
    pub fn block_bytes(&self) -> usize {
        self.half_elems() * 2 * 2
    }

    /// Blocks of every layer that fit `bytes`.
    pub fn blocks_in(&self, bytes: usize) -> usize {
        bytes / (self.block_bytes() * self.layers).max(1)
    }
}

/// The blocks of one shape. Shared through an `Arc` by the caches that
/// lease its blocks.
pub struct KvPool<M: DeviceMemory> {
    shape: KvShape,
    blocks: u32,
    base: u64,
    free: Mutex<Vec<u32>>,
    /// The blocks' memory, freed with the pool (after its last lease).
    _memory: M::Buffer,
}

/// One block id of a pool, held; dropping the last clone frees it.
pub struct BlockLease<M: DeviceMemory> {
    id: u32,
    pool: Arc<KvPool<M>>,
}

impl<M: DeviceMemory> BlockLease<M> {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn pool(&self) -> &Arc<KvPool<M>> {
        &self.pool
    }
}

impl<M: DeviceMemory> Drop for BlockLease<M> {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.push(self.id);
        }
    }
}

impl<M: DeviceMemory> KvPool<M> {
    /// A pool of `blocks` blocks of `shape`, in one allocation.
    pub fn new(memory: &M, shape: KvShape, blocks: usize) -> Result<Arc<Self>, CudaError> {
        let blocks = u32::try_from(blocks)
            .ok()
            .filter(|b| *b > 0 && *b < i32::MAX as u32)
            .ok_or_else(|| CudaError::Layout(format!("a KV pool of {blocks} blocks")))?;
        let bytes = (blocks as usize)
            .checked_mul(shape.block_bytes())
            .and_then(|b| b.checked_mul(shape.layers))
            .ok_or_else(|| CudaError::Layout(format!("a KV pool of {blocks} blocks overflows")))?;
        let buf = memory.alloc(bytes)?;
        let base = memory.address(&buf);
        Ok(Arc::new(KvPool {
            shape,
            blocks,
            base,
            // Handed out from the low ids up.
            free: Mutex::new((0..blocks).rev().collect()),
            _memory: buf,
        }))
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// Blocks in the pool.
    pub fn blocks(&self) -> usize {
        self.blocks as usize
    }

    /// Blocks free now.
    pub fn free_blocks(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// Device address of layer `layer`'s blocks: the kernels' `pool`.
    pub fn layer_address(&self, layer: usize) -> u64 {
        self.base + (layer * self.blocks as usize * self.shape.block_bytes()) as u64
    }

    /// A free block, or [`CudaError::Budget`] when none is left.
    pub fn lease(self: &Arc<Self>) -> Result<BlockLease<M>, CudaError> {
        let id = self.free.lock().map_err(|_| poisoned())?.pop();
        let id = id.ok_or_else(|| CudaError::Budget {
            what: "a KV block".into(),
            bytes: self.shape.block_bytes() * self.shape.layers,
            free: 0,
            budget: self.blocks as usize * self.shape.block_bytes() * self.shape.layers,
        })?;
        Ok(BlockLease {
            id,
            pool: Arc::clone(self),
        })
    }
}

fn poisoned() -> CudaError {
    CudaError::Driver {
        op: "KV pool",
        detail: "a thread panicked while holding the pool".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HostMemory;
    use super::*;

    pub(crate) fn shape() -> KvShape {
        KvShape {
            layers: 2,
            n_kv_heads: 2,
            head_dim: 4,
        }
    }

    #[test]
    fn blocks_lie_where_the_kernel_looks_and_return_when_released() {
        let mem = HostMemory::new(1 << 20);
        let s = shape();
        assert_eq!(s.block_bytes(), 2 * 2 * 32 * 4 * 2);
        let pool = KvPool::new(&mem, s, 3).unwrap();
        assert_eq!(mem.used(), 3 * 2 * s.block_bytes());
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_eq!((a.id(), b.id()), (0, 1));
        // attention.cu: pool(layer) + id · block size; every block of
        // every layer lies apart inside the one allocation.
        let at = |layer: usize, id: u32| {
            pool.layer_address(layer) + (id as usize * s.block_bytes()) as u64
        };
        mem.write_at(at(1, b.id()) + 10, &[9, 8]).unwrap();
        assert_eq!(
            at(1, 0),
            at(0, 2) + s.block_bytes() as u64,
            "layer 1 follows layer 0's 3 blocks"
        );
        assert!(mem.read_at(at(1, 2), s.block_bytes()).is_some());
        assert!(
            mem.read_at(at(1, 2) + 1, s.block_bytes()).is_none(),
            "the last block ends the pool"
        );
        assert_eq!(mem.read_at(at(0, b.id()) + 10, 2), Some(vec![0, 0]));
        assert_eq!(mem.read_at(at(1, a.id()) + 10, 2), Some(vec![0, 0]));
        assert_eq!(mem.read_at(at(1, b.id()) + 10, 2), Some(vec![9, 8]));

        let c = pool.lease().unwrap();
        let err = pool.lease().err().unwrap().to_string();
        assert!(err.contains("a KV block"), "{err}");
        let shared = Arc::new(c);
        let again = Arc::clone(&shared);
        drop(shared);
        assert_eq!(pool.free_blocks(), 0, "a block lives while a holder does");
        drop(again);
        assert_eq!(pool.free_blocks(), 1);
        assert_eq!(pool.lease().unwrap().id(), 2);
    }

    #[test]
    fn a_pool_too_large_for_the_device_is_refused() {
        let mem = HostMemory::new(1000);
        assert!(matches!(
            KvPool::new(&mem, shape(), 4),
            Err(CudaError::OutOfMemory { .. })
        ));
        assert_eq!(shape().blocks_in(10 * 2 * 1024), 10);
    }
}
