//! [`CpuBackend`]: the CPU backend's state (its ISA, thread pool and KV
//! pool); the [`crate::Backend`] operations on it are in `backend_ops`.

use std::sync::Arc;

use super::isa::CheckedIsa;
use super::kv_pool::{KvConfig, KvPool};
use super::threads::ThreadPool;
use super::weight_arena::WeightArena;
use super::Isa;

/// The CPU backend: SIMD kernels for one ISA chosen at construction, run on
/// a persistent thread pool.
pub struct CpuBackend {
    pub(super) isa: CheckedIsa,
    pub(super) pool: ThreadPool,
    /// Where repacked matrices live (on 2 MB pages where the OS allows).
    pub(super) arena: WeightArena,
    /// The KV element type and the budget every cache reserves from.
    pub(super) kv: Arc<KvPool>,
}

impl CpuBackend {
    /// A backend on `threads` threads (`0`: all available) using the best
    /// ISA this machine supports, capped by `SWITCHYARD_ISA` when set.
    pub fn new(threads: usize) -> CpuBackend {
        CpuBackend::with_isa(threads, Isa::from_env())
    }

    /// A backend using `isa`, or the best supported level below it when the
    /// machine lacks it (see [`CpuBackend::isa`] for the level in use).
    /// Ignores `SWITCHYARD_ISA`.
    pub fn with_isa(threads: usize, isa: Isa) -> CpuBackend {
        CpuBackend {
            isa: CheckedIsa::at_most(isa),
            pool: ThreadPool::new(threads),
            arena: WeightArena::default(),
            kv: KvPool::new(KvConfig::default()),
        }
    }

    /// This backend with KV caches of `config`'s type and budget (the
    /// default: F16, half the available memory).
    pub fn with_kv(mut self, config: KvConfig) -> CpuBackend {
        self.kv = KvPool::new(config);
        self
    }

    /// The pool KV caches reserve from (its type, budget and use).
    pub fn kv_pool(&self) -> &KvPool {
        &self.kv
    }

    /// The ISA the kernels run with.
    pub fn isa(&self) -> Isa {
        self.isa.get()
    }

    /// Threads a kernel call runs on (the caller included).
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The pool kernels run on, for callers with their own parallel work.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("isa", &self.isa.get())
            .field("threads", &self.threads())
            .field("kv", &self.kv.dtype())
            .finish()
    }
}
