//! [`CpuBackend`]: the CPU backend's state (its ISA, thread pool and
//! weight arena); the [`crate::Backend`] operations on it are in
//! `backend_ops`.

use super::attention::bf16::Bf16Isa;
use super::attention::Products;
use super::isa::CheckedIsa;
use super::threads::ThreadPool;
use super::weight_arena::WeightArena;
use super::Isa;
use crate::AttentionPrecision;

/// The CPU backend: SIMD kernels for one ISA chosen at construction, run on
/// a persistent thread pool.
pub struct CpuBackend {
    pub(super) isa: CheckedIsa,
    pub(super) pool: ThreadPool,
    /// Where repacked matrices live (on 2 MB pages where the OS allows).
    pub(super) arena: WeightArena,
    /// Attention's products (`--attention-precision`).
    pub(super) attention: Products,
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
            attention: Products::F32,
        }
    }

    /// This backend with attention's products in `precision`.
    pub fn with_attention_precision(mut self, precision: AttentionPrecision) -> CpuBackend {
        self.attention = match precision {
            AttentionPrecision::F32 => Products::F32,
            // Without AMX every row is f32: nothing to warn about.
            AttentionPrecision::Bf16Prompt => {
                Products::Bf16(Bf16Isa::new(self.isa).for_prompts_only())
            }
            AttentionPrecision::Bf16x3 => {
                Products::Bf16(Bf16Isa::new(self.isa).split_for_prompts())
            }
            AttentionPrecision::Bf16 => {
                let isa = Bf16Isa::new(self.isa);
                if !isa.simd() {
                    tracing::warn!(
                        "--attention-precision bf16 without AVX-512 BF16 (or with \
                         SWITCHYARD_ISA below avx512): the scalar path gives the same \
                         results much more slowly than f32"
                    );
                }
                Products::Bf16(isa)
            }
        };
        self
    }

    /// The precision of attention's products.
    pub fn attention_precision(&self) -> AttentionPrecision {
        match self.attention {
            Products::F32 => AttentionPrecision::F32,
            Products::Bf16(b) if b.split() => AttentionPrecision::Bf16x3,
            Products::Bf16(b) if b.prompt_only() => AttentionPrecision::Bf16Prompt,
            Products::Bf16(_) => AttentionPrecision::Bf16,
        }
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
            .field("attention", &self.attention_precision())
            .finish()
    }
}
