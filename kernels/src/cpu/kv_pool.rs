//! The KV memory of one backend: an element type for every cache and a
//! byte budget shared by all of them.
//!
//! A cache reserves, when it is made, the bytes of every block it may ever
//! hold (its capacity, or its windowed layers' rings) and gives them back
//! when dropped; it allocates the blocks themselves only as positions are
//! written. So admission is decided once, by blocks, up front: a sequence
//! that was admitted never runs out of budget half way, and one that does
//! not fit is refused (or waits) while the others keep running. The
//! allocations are fallible besides (`try_reserve`), so a host that has
//! less memory than the budget promised fails one step, not the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::kv_layout::KEY_BLOCK;
use crate::KernelError;

/// How keys and values are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// Four bytes an element: exact.
    F32,
    /// Two bytes an element, rounded to nearest even on write (as
    /// llama.cpp's default `-ctk f16 -ctv f16`).
    #[default]
    F16,
    /// 34 bytes per 32 elements, as llama.cpp's `-ctk q8_0 -ctv q8_0`: each
    /// position's key and value of a KV head in groups of 32 dimensions,
    /// int8 with an f16 scale per group (see `kv_q8` for the rounding).
    /// Needs a head_dim that is a multiple of 32.
    Q8_0,
}

impl KvType {
    /// Bytes of `elements` keys or values stored one after another (for
    /// Q8_0, whole groups of 32: a partial group still takes a group's
    /// 34 bytes); `None` on overflow.
    pub fn bytes_of(self, elements: usize) -> Option<usize> {
        match self {
            KvType::F32 => elements.checked_mul(4),
            KvType::F16 => elements.checked_mul(2),
            KvType::Q8_0 => elements.div_ceil(Q8_GROUP).checked_mul(Q8_GROUP_BYTES),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Refuses a head_dim the type cannot store: Q8_0 quantizes whole
    /// groups of 32 dimensions of one head.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KernelError> {
        if self == KvType::Q8_0 && !head_dim.is_multiple_of(Q8_GROUP) {
            return Err(KernelError::Shape {
                op: "kv_cache",
                detail: format!(
                    "a q8_0 KV cache stores groups of {Q8_GROUP} dimensions of a head, but \
                     this model's head_dim is {head_dim}; use --kv-type f16 or f32"
                ),
            });
        }
        Ok(())
    }
}

/// Dimensions of one Q8_0 group, and its bytes: 32 int8 and an f16 scale.
pub(crate) const Q8_GROUP: usize = 32;
pub(crate) const Q8_GROUP_BYTES: usize = Q8_GROUP + 2;

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!("unknown KV type {other:?}; use f16, f32 or q8_0")),
        }
    }
}

/// The KV settings of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    pub dtype: KvType,
    /// Bytes all caches of the backend may reserve together.
    pub budget_bytes: usize,
    /// Positions per block: the unit of allocation and of the prompt
    /// cache. A multiple of [`KEY_BLOCK`] (see [`check_block_positions`]).
    pub block_positions: usize,
}

/// Positions per block unless configured. A KV head's part of a block is
/// one run (see `kv_cache`), and a decode step's attention task streams
/// one run: longer runs keep the hardware prefetchers going. SmolLM2 at
/// 4k/8k context, 2 threads, decode tok/s by block size: 32 positions
/// (8 KB runs) 138/79, 256 174/107, 1024 (256 KB runs) 204/131, 2048
/// 203/130. Larger blocks make the prompt cache share coarser prefixes.
pub const DEFAULT_BLOCK_POSITIONS: usize = 1024;

/// The largest block (positions).
const MAX_BLOCK_POSITIONS: usize = 1 << 16;

impl Default for KvConfig {
    /// F16, half the memory available now (see [`default_budget`]), and
    /// [`DEFAULT_BLOCK_POSITIONS`].
    fn default() -> Self {
        KvConfig {
            dtype: KvType::F16,
            budget_bytes: default_budget(),
            block_positions: DEFAULT_BLOCK_POSITIONS,
        }
    }
}

/// Refuses a block size the caches cannot use: blocks hold whole key
/// blocks of attention ([`KEY_BLOCK`] positions).
pub fn check_block_positions(positions: usize) -> Result<usize, String> {
    if positions == 0 || !positions.is_multiple_of(KEY_BLOCK) || positions > MAX_BLOCK_POSITIONS {
        return Err(format!(
            "a KV block of {positions} positions: use a multiple of {KEY_BLOCK} from \
             {KEY_BLOCK} to {MAX_BLOCK_POSITIONS}"
        ));
    }
    Ok(positions)
}

/// Half of the memory the kernel reports available (`MemAvailable`), the
/// rest left to weights, activations and the OS; 4 GiB where that cannot
/// be read.
pub fn default_budget() -> usize {
    const FALLBACK: usize = 4 << 30;
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map(|kib| kib.saturating_mul(1024));
    available.map_or(FALLBACK, |bytes| bytes / 2)
}

/// The budget all caches of a backend reserve from.
#[derive(Debug)]
pub struct KvPool {
    config: KvConfig,
    reserved: AtomicUsize,
}

impl KvPool {
    /// A pool of `config`, its block size rounded up to a usable one (see
    /// [`check_block_positions`], which callers use to refuse others).
    pub fn new(config: KvConfig) -> Arc<KvPool> {
        let block_positions = config
            .block_positions
            .clamp(KEY_BLOCK, MAX_BLOCK_POSITIONS)
            .next_multiple_of(KEY_BLOCK);
        Arc::new(KvPool {
            config: KvConfig {
                block_positions,
                ..config
            },
            reserved: AtomicUsize::new(0),
        })
    }

    /// A pool without a limit (tests, tools).
    pub fn unlimited(dtype: KvType) -> Arc<KvPool> {
        KvPool::new(KvConfig {
            dtype,
            budget_bytes: usize::MAX,
            block_positions: DEFAULT_BLOCK_POSITIONS,
        })
    }

    /// A pool without a limit whose blocks hold `block_positions` (tests).
    #[cfg(test)]
    pub(crate) fn unlimited_blocks(dtype: KvType, block_positions: usize) -> Arc<KvPool> {
        KvPool::new(KvConfig {
            dtype,
            budget_bytes: usize::MAX,
            block_positions,
        })
    }

    /// Positions per block of every cache of the pool.
    pub fn block_positions(&self) -> usize {
        self.config.block_positions
    }

    pub fn dtype(&self) -> KvType {
        self.config.dtype
    }

    pub fn budget_bytes(&self) -> usize {
        self.config.budget_bytes
    }

    /// Bytes reserved by live caches.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Takes `bytes` from the budget, or says how far it is short.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, KernelError> {
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
            Err(held) => Err(KernelError::KvBudget {
                needed: bytes,
                free: budget.saturating_sub(held),
                budget,
            }),
        }
    }
}

/// Bytes held from a [`KvPool`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    pool: Arc<KvPool>,
    bytes: usize,
}

impl Reservation {
    pub(crate) fn bytes(&self) -> usize {
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

    #[test]
    fn reservations_stay_within_the_budget_and_come_back_on_drop() {
        let pool = KvPool::new(KvConfig {
            dtype: KvType::F16,
            budget_bytes: 100,
            ..KvConfig::default()
        });
        let a = pool.reserve(60).unwrap();
        match pool.reserve(41) {
            Err(KernelError::KvBudget {
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
    fn block_sizes_are_whole_key_blocks() {
        assert_eq!(check_block_positions(1024), Ok(1024));
        assert_eq!(check_block_positions(32), Ok(32));
        for bad in [0, 31, 48, 1 << 17] {
            let err = check_block_positions(bad).unwrap_err();
            assert!(err.contains("multiple of 32"), "{bad}: {err}");
        }
        assert_eq!(
            KvPool::unlimited_blocks(KvType::F16, 40).block_positions(),
            64
        );
        assert_eq!(
            KvPool::unlimited_blocks(KvType::F16, 0).block_positions(),
            32
        );
    }

    #[test]
    fn kv_types_parse() {
        assert_eq!("F16".parse::<KvType>(), Ok(KvType::F16));
        assert_eq!("f32".parse::<KvType>(), Ok(KvType::F32));
        assert_eq!("Q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4".parse::<KvType>().is_err());
        for t in [KvType::F32, KvType::F16, KvType::Q8_0] {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
    }

    #[test]
    fn bytes_are_exact_per_type() {
        // One block of SmolLM2's 3 KV heads of 64: 32 keys and 32 values.
        let elements = 3 * 64 * 2 * 32;
        assert_eq!(KvType::F32.bytes_of(elements), Some(4 * elements));
        assert_eq!(KvType::F16.bytes_of(elements), Some(2 * elements));
        assert_eq!(KvType::Q8_0.bytes_of(elements), Some(elements / 32 * 34));
        assert_eq!(KvType::Q8_0.bytes_of(usize::MAX), None);
    }

    #[test]
    fn q8_0_refuses_a_head_dim_off_its_groups() {
        assert!(KvType::Q8_0.check_head_dim(64).is_ok());
        assert!(KvType::F16.check_head_dim(80).is_ok());
        let err = KvType::Q8_0.check_head_dim(80).unwrap_err().to_string();
        assert!(err.contains("head_dim is 80"), "{err}");
    }
}
