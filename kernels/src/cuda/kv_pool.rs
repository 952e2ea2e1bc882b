//! Device memory for keys and values: one allocation per head shape, cut
//! into units of [`KV_UNIT`] positions of one layer that `attention.cu`
//! names by number (a unit is `pool + id · unit bytes`; each unit
//! `[K | V]`, each half `[kv_head][position][head_dim]` in F16).
//!
//! The engine's blocks (1,024 positions by default, a short cache's
//! shorter) are runs of units (see `kv_units`), so blocks of every size
//! share one pool and one launch. A [`UnitLease`] holds one unit; dropping
//! it returns the unit to the free list.

use std::sync::{Arc, Mutex};

use super::memory::DeviceMemory;
use super::CudaError;
use crate::kv::KV_UNIT;

/// The head shape every unit of a pool has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvShape {
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// F16 elements of one half (K or V) of a unit.
    pub fn half_elems(&self) -> usize {
        self.n_kv_heads * KV_UNIT * self.head_dim
    }

    /// Bytes of one unit (K and V, F16).
    pub fn unit_bytes(&self) -> usize {
        self.half_elems() * 2 * 2
    }
}

struct State<M: DeviceMemory> {
    buf: M::Buffer,
    free: Vec<u32>,
}

/// The units of one shape, shared through an `Arc` by their leases.
pub struct KvPool<M: DeviceMemory> {
    memory: M,
    shape: KvShape,
    units: u32,
    base: u64,
    state: Mutex<State<M>>,
}

/// One unit of a pool, held; dropping it frees the unit.
pub struct UnitLease<M: DeviceMemory> {
    id: u32,
    pool: Arc<KvPool<M>>,
}

impl<M: DeviceMemory> UnitLease<M> {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn pool(&self) -> &Arc<KvPool<M>> {
        &self.pool
    }
}

impl<M: DeviceMemory> Drop for UnitLease<M> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.pool.state.lock() {
            state.free.push(self.id);
        }
    }
}

impl<M: DeviceMemory> KvPool<M> {
    /// A pool of `units` units of `shape`, in one allocation.
    pub fn new(memory: M, shape: KvShape, units: usize) -> Result<Arc<Self>, CudaError> {
        let units = u32::try_from(units)
            .ok()
            .filter(|u| *u > 0 && *u < i32::MAX as u32)
            .ok_or_else(|| CudaError::Layout(format!("a KV pool of {units} units")))?;
        let bytes = (units as usize)
            .checked_mul(shape.unit_bytes())
            .ok_or_else(|| CudaError::Layout(format!("a KV pool of {units} units overflows")))?;
        let buf = memory.alloc(bytes)?;
        let base = memory.address(&buf);
        Ok(Arc::new(KvPool {
            memory,
            shape,
            units,
            base,
            // Handed out from the low ids up.
            state: Mutex::new(State {
                buf,
                free: (0..units).rev().collect(),
            }),
        }))
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// Units in the pool.
    pub fn units(&self) -> usize {
        self.units as usize
    }

    /// Units free now.
    pub fn free_units(&self) -> usize {
        self.state.lock().map(|s| s.free.len()).unwrap_or(0)
    }

    /// Device address of unit 0: the kernels' `pool`.
    pub fn address(&self) -> u64 {
        self.base
    }

    /// A free unit, or [`CudaError::Budget`] when none is left.
    pub fn lease(self: &Arc<Self>) -> Result<UnitLease<M>, CudaError> {
        let id = self.state.lock().map_err(|_| poisoned())?.free.pop();
        let unit = self.shape.unit_bytes();
        let id = id.ok_or_else(|| CudaError::Budget {
            what: "a KV unit of 32 positions".into(),
            bytes: unit,
            free: 0,
            budget: self.units as usize * unit,
        })?;
        Ok(UnitLease {
            id,
            pool: Arc::clone(self),
        })
    }

    /// Unit `src` copied over unit `dst`.
    pub fn copy(&self, src: u32, dst: u32) -> Result<(), CudaError> {
        let unit = self.shape.unit_bytes();
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        self.memory.copy_within(
            &mut state.buf,
            src as usize * unit,
            dst as usize * unit,
            unit,
        )
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

    fn shape() -> KvShape {
        KvShape {
            n_kv_heads: 2,
            head_dim: 4,
        }
    }

    #[test]
    fn units_lie_where_the_kernel_looks_copy_and_return_when_released() {
        let mem = HostMemory::new(1 << 20);
        let s = shape();
        assert_eq!(s.unit_bytes(), 2 * 2 * 32 * 4 * 2);
        let pool = KvPool::new(mem.clone(), s, 3).unwrap();
        assert_eq!(mem.used(), 3 * s.unit_bytes());
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_eq!((a.id(), b.id()), (0, 1));
        // attention.cu: pool + id · unit bytes.
        let at = |id: u32| pool.address() + (id as usize * s.unit_bytes()) as u64;
        mem.write_at(at(b.id()) + 10, &[9, 8]).unwrap();
        assert_eq!(mem.read_at(at(a.id()) + 10, 2), Some(vec![0, 0]));
        pool.copy(b.id(), a.id()).unwrap();
        assert_eq!(mem.read_at(at(a.id()) + 10, 2), Some(vec![9, 8]));
        assert!(mem.read_at(at(2), s.unit_bytes()).is_some());
        assert!(
            mem.read_at(at(2) + 1, s.unit_bytes()).is_none(),
            "unit 2 ends the pool"
        );

        let c = pool.lease().unwrap();
        let err = pool.lease().err().unwrap().to_string();
        assert!(err.contains("a KV unit"), "{err}");
        drop(c);
        assert_eq!(pool.free_units(), 1);
        assert_eq!(pool.lease().unwrap().id(), 2);
    }

    #[test]
    fn a_pool_too_large_for_the_device_is_refused() {
        let mem = HostMemory::new(1000);
        assert!(matches!(
            KvPool::new(mem, shape(), 4),
            Err(CudaError::OutOfMemory { .. })
        ));
    }
}
