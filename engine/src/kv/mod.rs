//! KV memory policy, the same for every device: what a sequence's cache
//! may reserve, which requests are admitted, which prompt blocks are kept,
//! shared and evicted.
//!
//! A backend only stores blocks by id and attends over a block table
//! (its `kv_store`, `kv_alloc`, `kv_free`, `kv_copy` and `attention`);
//! everything that decides is here:
//!
//! - `config.rs`: the settings (`--kv-type`, `--kv-block`, the budget);
//! - `budget.rs`: [`KvPool`], the byte budget every cache and cached block
//!   reserves from, counted from the device-neutral
//!   [`switchyard_kernels::KvLayout`] (so a cache's cost is known before
//!   the backend allocates anything);
//! - `blocks.rs`: [`KvBlocks`], the backend's store of blocks and how many
//!   holders each block has (a block goes back when the last lets go);
//! - `sequence.rs`: [`SequenceKv`], a sequence's block table (allocated as
//!   positions are written, truncated on rollback), the shared blocks it
//!   reads and its reservation;
//! - `block.rs`: [`SharedBlock`], a block the prompt cache keeps;
//! - `key.rs`: [`CacheKey`], what besides tokens decides a block's contents
//!   (the weights, an adapter): the root of every block hash;
//! - `prefix_cache.rs`: the prompt cache (hash chains, tails, eviction);
//! - `window.rs`: what the prompt cache keeps of sliding-window layers;
//! - `admission.rs`: admission by KV blocks.

pub(crate) mod admission;
mod block;
mod blocks;
mod budget;
mod config;
mod key;
pub(crate) mod prefix_cache;
mod scope_quota;
mod sequence;
pub(crate) mod window;
pub(crate) mod window_snapshot;

use switchyard_kernels::KernelError;

pub use admission::{kv_positions, KvAdvice};
pub use block::{CachedBlock, SharedBlock};
pub use blocks::{KvBlocks, KvStoreGuard};
pub use budget::{KvPool, Reservation};
pub use config::{default_budget, KvConfig};
pub use key::CacheKey;
pub use prefix_cache::ScopeUsage;
pub use sequence::SequenceKv;

/// Why a cache or a shared block could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The budget cannot hold it now; `needed > budget` means it never can.
    #[error(
        "a KV cache of {needed} bytes does not fit the KV budget: {free} of {budget} bytes free"
    )]
    Budget {
        needed: usize,
        free: usize,
        budget: usize,
    },
    /// A windowed cache's blocks, or a cache shorter than a block: never
    /// shared.
    #[error(
        "the cache's blocks cannot be shared (sliding-window layers, or shorter than a block)"
    )]
    NotShareable,
    /// A write into a block the sequence does not hold alone (a shared
    /// prompt block): an engine bug, never a request's.
    #[error("a write at position {position} would change a KV block shared with other sequences")]
    SharedWrite { position: usize },
    /// A write that starts past the positions written.
    #[error("a write from position {start} leaves a gap after the {len} positions written")]
    Gap { start: usize, len: usize },
    /// A windowed cache rolled back further than its rings keep.
    #[error("a sliding-window KV cache rolls back at most {max} positions, not {asked}")]
    Rollback { asked: usize, max: usize },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}
