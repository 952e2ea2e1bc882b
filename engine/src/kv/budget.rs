//! The KV budget: bytes every cache and shared block of one device
//! reserves from, and gives back when dropped.
//!
//! A cache reserves, when it is made, the bytes of every block its layout
//! may ever hold (its capacity, or its windowed layers' rings) and gives
//! them back when dropped; the backend allocates the blocks themselves
//! only as positions are written. So admission is decided once, by
//! blocks, up front: a sequence that was admitted never runs out of
//! budget half way, and one that does not fit is refused (or waits) while
//! the others keep running. The backend's allocations are fallible
//! besides, so a host that has less memory than the budget promised fails
//! one step, not the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use switchyard_kernels::KvFormat;

use super::config::KvConfig;
use super::KvError;

/// The budget all caches of a device reserve from, and the format of
/// their blocks.
#[derive(Debug)]
pub struct KvPool {
    config: KvConfig,
    reserved: AtomicUsize,
}

impl KvPool {
    /// A pool of `config`, its block size rounded up to a usable one (see
    /// `switchyard_kernels::kv::check_block_positions`, which callers use
    /// to refuse others).
    pub fn new(config: KvConfig) -> Arc<KvPool> {
        let format = KvFormat::new(config.dtype, config.block_positions);
        Arc::new(KvPool {
            config: KvConfig {
                block_positions: format.block_positions,
                ..config
            },
            reserved: AtomicUsize::new(0),
        })
    }

    /// A pool without a limit of the default block size (tests, tools).
    pub fn unlimited(dtype: switchyard_kernels::KvType) -> Arc<KvPool> {
        KvPool::new(KvConfig {
            dtype,
            budget_bytes: usize::MAX,
            ..KvConfig::default()
        })
    }

    /// How its blocks are stored.
    pub fn format(&self) -> KvFormat {
        KvFormat::new(self.config.dtype, self.config.block_positions)
    }

    /// Its settings.
    pub fn config(&self) -> KvConfig {
        self.config
    }

    /// Positions per block of every cache of the pool.
    pub fn block_positions(&self) -> usize {
        self.config.block_positions
    }

    pub fn budget_bytes(&self) -> usize {
        self.config.budget_bytes
    }

    /// Bytes reserved by live caches and shared blocks.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Takes `bytes` from the budget, or says how far it is short.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, KvError> {
        let budget = self.config.budget_bytes;
        let taken = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= budget)
            });
        match taken {
            Ok(_) => Ok(Reservation {
                pool: Arc::clone(self),
                bytes,
            }),
            Err(held) => Err(KvError::Budget {
                needed: bytes,
                free: budget.saturating_sub(held),
                budget,
            }),
        }
    }
}

/// Bytes held from a [`KvPool`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    pool: Arc<KvPool>,
    bytes: usize,
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_kernels::KvType;

    #[test]
    fn reservations_stay_within_the_budget_and_come_back_on_drop() {
        let pool = KvPool::new(KvConfig {
            dtype: KvType::F16,
            budget_bytes: 100,
            ..KvConfig::default()
        });
        let a = pool.reserve(60).unwrap();
        match pool.reserve(41) {
            Err(KvError::Budget {
                needed: 41,
                free: 40,
                budget: 100,
            }) => {}
            other => panic!("expected a budget error, got {other:?}"),
        }
        let b = pool.reserve(40).unwrap();
        assert_eq!(pool.reserved_bytes(), 100);
        drop(a);
        drop(b);
        assert_eq!(pool.reserved_bytes(), 0);
        assert!(pool.reserve(101).is_err());
    }

    #[test]
    fn a_pool_rounds_its_block_size_to_whole_units() {
        let pool = KvPool::new(KvConfig {
            block_positions: 40,
            ..KvConfig::default()
        });
        assert_eq!(pool.block_positions(), 64);
        assert_eq!(pool.format().block_positions, 64);
    }
}
