//! A KV block the prompt cache keeps and sequences share: the device
//! blocks it names (one per layer), and the bytes of the budget it holds.

use std::sync::Arc;

use switchyard_kernels::{Backend, BlockId};

use super::blocks::KvBlocks;
use super::budget::Reservation;
use super::window_snapshot::WindowSnapshot;

/// What the prompt cache needs of a block it keeps.
pub trait CachedBlock: Clone {
    /// Handles to the block alive now: 1 means only the caller's, so
    /// dropping it frees the block and its budget.
    fn holders(&self) -> usize;
    /// Bytes of the KV budget the block holds.
    fn bytes(&self) -> usize;
}

/// One block of every layer, shared read-only between caches (a full
/// prompt block, or the copied written start of one: a tail); in a cache
/// with sliding-window layers, of every global layer, and where a prompt
/// ended, a copy of the windowed layers' rings (`window`). Cloning is
/// cheap; its device blocks lose a holder and its budget goes back when
/// the last handle drops.
pub struct SharedBlock<B: Backend>(Arc<Held<B>>);

struct Held<B: Backend> {
    /// Per layer, the device block (none for a windowed layer).
    ids: Vec<Option<BlockId>>,
    window: Option<WindowSnapshot>,
    /// Positions of each block.
    positions: usize,
    blocks: Arc<KvBlocks<B>>,
    reservation: Reservation,
}

impl<B: Backend> SharedBlock<B> {
    /// A handle to `ids` and `window`'s blocks (one holder each, the
    /// handle's), of `positions`.
    pub(super) fn new(
        ids: Vec<Option<BlockId>>,
        window: Option<WindowSnapshot>,
        positions: usize,
        blocks: &Arc<KvBlocks<B>>,
        reservation: Reservation,
    ) -> Self {
        SharedBlock(Arc::new(Held {
            ids,
            window,
            positions,
            blocks: Arc::clone(blocks),
            reservation,
        }))
    }

    /// Layer `layer`'s device block (none for a windowed layer).
    pub(super) fn id(&self, layer: usize) -> Option<BlockId> {
        self.0.ids.get(layer).copied().flatten()
    }

    /// The windowed layers' rings where a prompt ended here.
    pub(crate) fn window(&self) -> Option<&WindowSnapshot> {
        self.0.window.as_ref()
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
        let window = self.window.take();
        let ids = self.ids.drain(..).flatten();
        self.blocks
            .held()
            .release(ids.chain(window.iter().flat_map(WindowSnapshot::ids)));
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
