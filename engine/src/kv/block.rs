//! A KV block the prompt cache keeps and sequences share: the device
//! blocks it names (one per layer), and the bytes of the budget it holds.

use std::sync::Arc;

use switchyard_kernels::{Backend, BlockId};

use super::blocks::KvBlocks;
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
/// cheap; its device blocks lose a holder and its budget goes back when
/// the last handle drops.
pub struct SharedBlock<B: Backend>(Arc<Held<B>>);

struct Held<B: Backend> {
    /// Per layer, the device block.
    ids: Vec<BlockId>,
    /// Positions of each block.
    positions: usize,
    blocks: Arc<KvBlocks<B>>,
    reservation: Reservation,
}

impl<B: Backend> SharedBlock<B> {
    /// A handle to `ids` (one holder each, the handle's), of `positions`.
    pub(super) fn new(
        ids: Vec<BlockId>,
        positions: usize,
        blocks: &Arc<KvBlocks<B>>,
        reservation: Reservation,
    ) -> Self {
        SharedBlock(Arc::new(Held {
            ids,
            positions,
            blocks: Arc::clone(blocks),
            reservation,
        }))
    }

    /// Layer `layer`'s device block.
    pub(super) fn id(&self, layer: usize) -> Option<BlockId> {
        self.0.ids.get(layer).copied()
    }

    /// Layers it holds a block of.
    pub(super) fn layers(&self) -> usize {
        self.0.ids.len()
    }

    /// Positions of each of its blocks.
    pub fn positions(&self) -> usize {
        self.0.positions
    }

    /// Whether its blocks live in `blocks`.
    pub(super) fn is_in(&self, blocks: &Arc<KvBlocks<B>>) -> bool {
        Arc::ptr_eq(&self.0.blocks, blocks)
    }
}

impl<B: Backend> Drop for Held<B> {
    fn drop(&mut self) {
        self.blocks.held().release(self.ids.drain(..));
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
