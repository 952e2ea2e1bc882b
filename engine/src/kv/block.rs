//! A KV block the prompt cache keeps and sequences share: the backend's
//! device memory, and the bytes of the budget it holds.

use std::sync::Arc;

use switchyard_kernels::Backend;

use super::budget::Reservation;

/// What the prompt cache needs of a block it keeps.
pub trait CachedBlock: Clone {
    /// Handles to the block alive now: 1 means only the caller's, so
    /// dropping it frees the block and its budget.
    fn holders(&self) -> usize;
    /// Bytes of the KV budget the block holds.
    fn bytes(&self) -> usize;
}

/// One block of every layer, shared read-only between caches (a full
/// prompt block, or the copied written start of one: a tail). Cloning is
/// cheap; the memory and its budget go back when the last handle drops.
pub struct SharedBlock<B: Backend>(Arc<Held<B>>);

struct Held<B: Backend> {
    device: B::KvBlock,
    reservation: Reservation,
}

impl<B: Backend> SharedBlock<B> {
    pub(super) fn new(device: B::KvBlock, reservation: Reservation) -> Self {
        SharedBlock(Arc::new(Held {
            device,
            reservation,
        }))
    }

    /// The backend's handle to the block's memory.
    pub fn device(&self) -> &B::KvBlock {
        &self.0.device
    }
}

impl<B: Backend> Clone for SharedBlock<B> {
    fn clone(&self) -> Self {
        SharedBlock(Arc::clone(&self.0))
    }
}

impl<B: Backend> CachedBlock for SharedBlock<B> {
    fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    fn bytes(&self) -> usize {
        self.0.reservation.bytes()
    }
}
