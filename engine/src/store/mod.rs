//! The weight store: every tensor the engine holds, stored once.
//!
//! A loaded checkpoint is a table of handles ([`Shared`]) into this store.
//! Tensors are keyed by their content (BLAKE3 of the bytes, with type and
//! shape), so checkpoints that share tensors — frozen layers, a shared
//! embedding, a fine-tune that touched a few matrices — hold one copy, and
//! the bytes resident are the deduplicated total, not the sum. A tensor
//! leaves memory when the last checkpoint that uses it is dropped.

mod shared;
mod weight_store;

pub use shared::Shared;
pub use weight_store::{StoreStats, TensorKey, WeightStore};
