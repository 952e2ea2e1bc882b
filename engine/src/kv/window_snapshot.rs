//! A sliding-window layer's ring as a prompt left it: what the prompt cache
//! keeps beside the block where a cached prompt ended (see `window.rs` for
//! how a later request starts from it). Its own module because both the
//! cached blocks that hold one and the cut-back that reads it use it.

use switchyard_kernels::{BlockId, KvLayout};

/// Every windowed layer's ring as a prompt left it.
#[derive(Debug)]
pub(crate) struct WindowSnapshot {
    /// Per layer, copies of its ring's blocks in table order (empty for a
    /// global layer).
    pub(super) rings: Vec<Vec<BlockId>>,
    /// Per layer, the blocks its ring had room for (the layout's
    /// `max_blocks`): where each position's slot is.
    pub(super) ring_blocks: Vec<usize>,
    /// Positions of each ring block (the layout's `block_positions`: a
    /// cache shorter than a block has one block of its own size, so two
    /// requests for different `max_tokens` may have rings of different
    /// sizes).
    pub(super) block: usize,
    /// Positions written when it was taken.
    pub(super) len: usize,
}

impl WindowSnapshot {
    /// Whether a cache of `layout` can start at position `start` from it:
    /// `start` within what was written, and per windowed layer either the
    /// same ring still holding the window before `start` (nothing of it
    /// overwritten by positions up to `len`), or, for rings of one block of
    /// another size, rings that never turned: every written position `p`
    /// is then at slot `p` in both, and [`WindowSnapshot::copied`] of each
    /// block carry them over.
    pub(crate) fn serves(&self, layout: &KvLayout, start: usize) -> bool {
        if start == 0 || start > self.len || self.rings.len() != layout.layers() {
            return false;
        }
        let block = layout.block_positions();
        (0..layout.layers()).all(|layer| match layout.window(layer) {
            None => true,
            Some(window) => {
                let ring = layout.max_blocks(layer);
                let slots = ring * block;
                let same_ring = self.ring_blocks.get(layer) == Some(&ring);
                if block == self.block {
                    same_ring
                        && (self.len <= slots || self.len - start <= slots.saturating_sub(window))
                } else {
                    same_ring && ring == 1 && self.len <= block.min(self.block)
                }
            }
        })
    }

    /// Positions to copy from each of its ring blocks into a ring block of
    /// `block` positions (of a layout it serves): the whole block, or
    /// where the sizes differ the smaller one's (it holds every written
    /// position).
    pub(crate) fn copied(&self, block: usize) -> usize {
        self.block.min(block)
    }

    /// Every block it holds.
    pub(super) fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.rings.iter().flatten().copied()
    }
}
