//! Block ids and block tables: how the engine names a backend's KV blocks
//! and tells attention where a sequence's positions lie.
//!
//! The engine's `kv` module allocates blocks (a backend's `kv_alloc`),
//! counts who holds each one and builds each sequence's table; a backend
//! only stores blocks by id and attends over the table it is given (the
//! CPU's `kv_store`, the CUDA kernel's `block_tables`).

use super::layout::KvLayout;
use crate::KernelError;

/// A block of a backend's KV store: one layer's keys and values of some
/// positions. Ids are the backend's to give out and are reused once freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// One sequence's blocks, per layer, in the order of its positions:
/// position `p` of layer `l` lives in `layer(l)[(p / block_positions) %
/// layout.max_blocks(l)]`, so a sliding-window layer's table is a ring that
/// wraps. The engine owns it and grows, shares and truncates it; attention
/// only reads it.
#[derive(Clone, Debug)]
pub struct BlockTable {
    layout: KvLayout,
    layers: Vec<Vec<BlockId>>,
}

impl BlockTable {
    /// An empty table for a cache of `layout`.
    pub fn new(layout: KvLayout) -> BlockTable {
        let layers = vec![Vec::new(); layout.layers()];
        BlockTable { layout, layers }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Layer `layer`'s blocks (empty for an unknown layer).
    pub fn layer(&self, layer: usize) -> &[BlockId] {
        self.layers.get(layer).map_or(&[], Vec::as_slice)
    }

    /// Every block of every layer.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.layers.iter().flatten().copied()
    }

    /// The blocks layer `layer` needs to hold positions `0..end`: one per
    /// block of positions, at most its ring.
    pub fn blocks_for(&self, layer: usize, end: usize) -> usize {
        end.div_ceil(self.layout.block_positions())
            .min(self.layout.max_blocks(layer))
    }

    /// The index in layer `layer`'s table of the block holding `position`.
    pub fn index_of(&self, layer: usize, position: usize) -> usize {
        (position / self.layout.block_positions()) % self.layout.max_blocks(layer).max(1)
    }

    /// Appends `id` to layer `layer`'s blocks; fails past the blocks the
    /// layout allows.
    pub fn push(&mut self, layer: usize, id: BlockId) -> Result<(), KernelError> {
        let max = self.layout.max_blocks(layer);
        match self.layers.get_mut(layer) {
            Some(blocks) if blocks.len() < max => {
                blocks.push(id);
                Ok(())
            }
            _ => Err(KernelError::Shape {
                op: "block_table",
                detail: format!("layer {layer} holds at most {max} blocks"),
            }),
        }
    }

    /// Removes layer `layer`'s blocks from index `keep` on, and returns them.
    pub fn truncate(&mut self, layer: usize, keep: usize) -> Vec<BlockId> {
        match self.layers.get_mut(layer) {
            Some(blocks) if keep < blocks.len() => blocks.split_off(keep),
            _ => Vec::new(),
        }
    }
}
