//! One sequence's KV: its block table (the device blocks its positions
//! lie in, per layer), the shared prompt blocks it starts from, and the
//! budget its own blocks hold.
//!
//! Blocks are allocated as positions are about to be written
//! ([`SequenceKv::prepare`], before each forward pass), so memory grows
//! with the tokens held; the budget of every block the sequence may ever
//! hold was reserved up front, so admission is decided once. A windowed
//! layer's table is a ring of a little more than its window.

use std::ops::Range;
use std::sync::Arc;

use switchyard_kernels::kv::{KV_UNIT, RING_SLACK};
use switchyard_kernels::{Backend, BlockId, BlockTable, KernelError, KvLayout, KvPrefix};

use super::block::SharedBlock;
use super::blocks::KvBlocks;
use super::budget::Reservation;
use super::window_snapshot::WindowSnapshot;
use super::KvError;
use crate::model::LlamaModel;

/// A sequence's KV cache.
pub struct SequenceKv<B: Backend> {
    table: BlockTable,
    blocks: Arc<KvBlocks<B>>,
    /// The shared blocks it started from: their handles, to hand back
    /// as they are ([`SequenceKv::share`]).
    prefix: Vec<SharedBlock<B>>,
    /// The budget of every block of its own it may hold.
    reservation: Reservation,
    /// Positions `0..len` are written.
    len: usize,
}

fn refuse(detail: String) -> KvError {
    KvError::Kernel(KernelError::Shape {
        op: "kv_share",
        detail,
    })
}

/// Refuses a prefix a cache of `layout` cannot start from.
fn check_prefix<B: Backend>(
    layout: &KvLayout,
    blocks: &Arc<KvBlocks<B>>,
    prefix: &KvPrefix<'_, SharedBlock<B>>,
) -> Result<(), KvError> {
    if prefix.shared.is_empty() && prefix.tail.is_none() {
        return Ok(());
    }
    let block = layout.block_positions();
    let covered = prefix.positions(block);
    if layout.windowed() {
        let deepest = prefix.tail.map(|(t, _)| t).or(prefix.shared.last());
        let serves = deepest
            .and_then(SharedBlock::window)
            .is_some_and(|w| w.serves(layout, covered));
        if !serves {
            return Err(refuse(format!(
                "a cache with sliding-window layers starts from a cached prefix only where \
                 its windows were kept, and the prefix of {covered} positions has none that serve"
            )));
        }
    }
    if covered >= layout.capacity() {
        return Err(refuse(format!(
            "a cached prefix of {covered} positions leaves no room in a cache of {}",
            layout.capacity()
        )));
    }
    let fits = |b: &SharedBlock<B>| b.is_in(blocks) && b.layers() == layout.layers();
    if !prefix.shared.is_empty() && !layout.full_blocks() {
        return Err(refuse(
            "a cache shorter than a block cannot start from shared blocks".into(),
        ));
    }
    if !prefix
        .shared
        .iter()
        .all(|b| fits(b) && b.positions() == block)
    {
        return Err(refuse(
            "a shared block's store or shape differs from the cache's".into(),
        ));
    }
    if let Some((tail, n)) = prefix.tail {
        if !fits(tail) || n == 0 || !n.is_multiple_of(KV_UNIT) || n > tail.positions().min(block) {
            return Err(refuse(format!(
                "{n} positions of a cached tail of {} do not fit the cache",
                tail.positions()
            )));
        }
    }
    Ok(())
}

impl<B: Backend> SequenceKv<B> {
    /// A cache of `layout` in `blocks`, starting from `prefix`: its shared
    /// blocks read in place (never written again), then the first
    /// positions of its tail copied into the cache's own next block.
    /// Reserves from the budget every block it may hold beyond the shared
    /// ones, before anything is allocated.
    pub fn new(
        backend: &B,
        blocks: &Arc<KvBlocks<B>>,
        layout: KvLayout,
        prefix: KvPrefix<'_, SharedBlock<B>>,
    ) -> Result<Self, KvError> {
        check_prefix(&layout, blocks, &prefix)?;
        let reservation = blocks
            .pool()
            .reserve(own_bytes(&layout, prefix.shared.len()))?;
        let window = prefix
            .tail
            .map(|(t, _)| t)
            .or(prefix.shared.last())
            .and_then(SharedBlock::window);
        let mut kv = SequenceKv {
            len: prefix.positions(layout.block_positions()),
            table: BlockTable::new(layout),
            blocks: Arc::clone(blocks),
            prefix: prefix.shared.to_vec(),
            reservation,
        };
        let mut held = blocks.held();
        for layer in 0..kv.table.layout().layers() {
            if kv.table.layout().window(layer).is_some() {
                // A ring of its own, the snapshot's copied slot for slot
                // (`check_prefix` saw it serve this layout).
                let ring = window
                    .and_then(|w| w.rings.get(layer))
                    .into_iter()
                    .flatten();
                let shape = kv
                    .table
                    .layout()
                    .block_shape(kv.table.layout().block_positions());
                let copied = window.map_or(shape.positions, |w| w.copied(shape.positions));
                for &from in ring {
                    let to = held.alloc(backend, shape)?;
                    kv.table.push(layer, to)?;
                    held.copy(backend, from, to, copied)?;
                }
                continue;
            }
            for shared in prefix.shared {
                let id = shared
                    .id(layer)
                    .ok_or_else(|| refuse("a layer short".into()))?;
                held.hold(id);
                kv.table.push(layer, id)?;
            }
            if let Some((tail, n)) = prefix.tail {
                let from = tail
                    .id(layer)
                    .ok_or_else(|| refuse("a layer short".into()))?;
                let shape = kv
                    .table
                    .layout()
                    .block_shape(kv.table.layout().block_positions());
                let to = held.alloc(backend, shape)?;
                kv.table.push(layer, to)?;
                held.copy(backend, from, to, n)?;
            }
        }
        Ok(kv)
    }

    /// A cache of `capacity` positions for `model`'s layers, in the
    /// format of `blocks`' budget, starting from `prefix`.
    pub fn for_model(
        backend: &B,
        blocks: &Arc<KvBlocks<B>>,
        model: &LlamaModel<B>,
        capacity: usize,
        prefix: KvPrefix<'_, SharedBlock<B>>,
    ) -> Result<Self, KvError> {
        let layout = model.kv_layout(blocks.pool().format(), capacity)?;
        Self::new(backend, blocks, layout, prefix)
    }

    /// Its block table, for the forward pass.
    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    pub fn layout(&self) -> &KvLayout {
        self.table.layout()
    }

    /// The store its blocks live in.
    pub fn blocks(&self) -> &Arc<KvBlocks<B>> {
        &self.blocks
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the blocks of `layer` in its table (shared ones too: it
    /// reads them); a windowed layer's stay at its ring however long the
    /// context.
    pub fn layer_allocated_bytes(&self, layer: usize) -> usize {
        self.table.layer(layer).len() * self.table.layout().block_bytes()
    }

    /// Bytes of the blocks in its table, every layer.
    pub fn allocated_bytes(&self) -> usize {
        (0..self.table.layout().layers())
            .map(|l| self.layer_allocated_bytes(l))
            .sum()
    }

    /// Bytes its own blocks reserved (the shared ones are their handles').
    pub fn reserved_bytes(&self) -> usize {
        self.reservation.bytes()
    }

    /// Makes ready the blocks positions `positions` are written to by the
    /// next forward pass: allocates those not in the table yet, and
    /// refuses a write into a block it does not hold alone (a shared
    /// prompt block) or one that leaves a gap. Positions past the range's
    /// end count as not written from here on.
    pub fn prepare(
        &mut self,
        backend: &B,
        positions: Range<usize>,
    ) -> Result<&BlockTable, KvError> {
        if positions.start > self.len {
            return Err(KvError::Gap {
                start: positions.start,
                len: self.len,
            });
        }
        let block = self.table.layout().block_positions();
        let mut held = self.blocks.held();
        for layer in 0..self.table.layout().layers() {
            let mut p = positions.start;
            while p < positions.end {
                let at = self.table.index_of(layer, p);
                if let Some(&id) = self.table.layer(layer).get(at) {
                    if held.holders(id) != 1 {
                        return Err(KvError::SharedWrite { position: p });
                    }
                }
                p = (p / block + 1) * block;
            }
            let wanted = self.table.blocks_for(layer, positions.end);
            let shape = self.table.layout().block_shape(block);
            while self.table.layer(layer).len() < wanted {
                let id = held.alloc(backend, shape)?;
                if let Err(e) = self.table.push(layer, id) {
                    held.release([id]);
                    return Err(e.into());
                }
            }
        }
        drop(held);
        self.len = positions.end;
        Ok(&self.table)
    }

    /// Forgets positions from `len` on (a speculative step's rejected
    /// draft tokens): the next write goes on from `len`, and blocks wholly
    /// past it go back to the store. A sliding-window layer's ring has
    /// overwritten older positions as new ones came, so a windowed cache
    /// rolls back at most [`RING_SLACK`] positions.
    pub fn truncate(&mut self, len: usize) -> Result<(), KvError> {
        if len >= self.len {
            return Ok(());
        }
        let back = self.len - len;
        if self.table.layout().windowed() && back > RING_SLACK {
            return Err(KvError::Rollback {
                asked: back,
                max: RING_SLACK,
            });
        }
        if !self.table.layout().windowed() {
            let keep = len.div_ceil(self.table.layout().block_positions());
            let mut held = self.blocks.held();
            for layer in 0..self.table.layout().layers() {
                held.release(self.table.truncate(layer, keep));
            }
        }
        self.len = len;
        Ok(())
    }

    /// Positions `positions` (a whole block, or the written start of one)
    /// as a block for the prompt cache, its bytes reserved from the pool:
    /// a whole block is handed out in place (never written again while the
    /// handle lives), a shorter run copied into blocks of its own. A block
    /// it started from is handed back as it is. In a cache with
    /// sliding-window layers only the global layers' blocks are shared;
    /// with `last` (the block where the prompt ends) the windowed layers'
    /// rings are copied as they stand (`window`).
    pub fn share(
        &mut self,
        backend: &B,
        positions: Range<usize>,
        last: bool,
    ) -> Result<SharedBlock<B>, KvError> {
        let layout = self.table.layout();
        let block = layout.block_positions();
        let whole = positions.len() == block && positions.start.is_multiple_of(block);
        if whole {
            if let Some(held) = self.prefix.get(positions.start / block) {
                return Ok(held.clone());
            }
        }
        if whole && !layout.full_blocks() {
            return Err(KvError::NotShareable);
        }
        let start_ok = positions.start.is_multiple_of(block)
            && !positions.is_empty()
            && positions.len().is_multiple_of(KV_UNIT)
            && positions.len() <= block;
        if !start_ok || positions.end > self.len {
            return Err(refuse(format!(
                "positions {positions:?} are not whole units written from the start of a \
                 block (of {block}; {} written)",
                self.len
            )));
        }
        let windowed = |layer: usize| layout.window(layer).is_some();
        let global = (0..layout.layers()).filter(|l| !windowed(*l)).count();
        // The rings only where the prompt ends (a block before it is a
        // parent on the way there; the rings have moved on past it).
        let snap = layout.windowed() && last;
        let rings: usize = (0..layout.layers())
            .filter(|l| snap && windowed(*l))
            .map(|l| self.table.layer(l).len())
            .sum();
        let bytes = layout
            .shared_bytes(positions.len())
            .map(|all| all / layout.layers().max(1) * global)
            .and_then(|b| b.checked_add(rings.checked_mul(layout.block_bytes())?))
            .ok_or(KvError::NotShareable)?;
        let reservation = self.blocks.pool().reserve(bytes)?;
        let index = positions.start / block;
        let mut held = self.blocks.held();
        let mut ids: Vec<Option<BlockId>> = Vec::with_capacity(layout.layers());
        let mut snapshot = WindowSnapshot {
            rings: vec![Vec::new(); layout.layers()],
            ring_blocks: (0..layout.layers()).map(|l| layout.max_blocks(l)).collect(),
            block,
            len: self.len,
        };
        let fail =
            |held: &mut super::blocks::Held<B>, ids: Vec<Option<BlockId>>, s: WindowSnapshot| {
                held.release(ids.into_iter().flatten().chain(s.ids().collect::<Vec<_>>()));
            };
        for layer in 0..layout.layers() {
            if windowed(layer) {
                ids.push(None);
                let ring = if snap { self.table.layer(layer) } else { &[] };
                for &from in ring {
                    let shape = layout.block_shape(block);
                    let to = match held.alloc(backend, shape) {
                        Ok(to) => to,
                        Err(e) => {
                            fail(&mut held, ids, snapshot);
                            return Err(e);
                        }
                    };
                    snapshot.rings[layer].push(to);
                    if let Err(e) = held.copy(backend, from, to, block) {
                        fail(&mut held, ids, snapshot);
                        return Err(e);
                    }
                }
                continue;
            }
            let Some(&from) = self.table.layer(layer).get(index) else {
                fail(&mut held, ids, snapshot);
                return Err(refuse(format!(
                    "block {index} of layer {layer} is not held"
                )));
            };
            if whole {
                held.hold(from);
                ids.push(Some(from));
                continue;
            }
            let to = match held.alloc(backend, layout.block_shape(positions.len())) {
                Ok(to) => to,
                Err(e) => {
                    fail(&mut held, ids, snapshot);
                    return Err(e);
                }
            };
            ids.push(Some(to));
            if let Err(e) = held.copy(backend, from, to, positions.len()) {
                fail(&mut held, ids, snapshot);
                return Err(e);
            }
        }
        drop(held);
        let window = snap.then_some(snapshot);
        Ok(SharedBlock::new(
            ids,
            window,
            positions.len(),
            &self.blocks,
            reservation,
        ))
    }
}

/// Bytes of the blocks a cache of `layout` may hold of its own after
/// `shared` shared blocks: a global layer's beyond them, a windowed
/// layer's whole ring (it never reads shared blocks).
fn own_bytes(layout: &KvLayout, shared: usize) -> usize {
    (0..layout.layers())
        .map(|l| match layout.window(l) {
            Some(_) => layout.max_blocks(l),
            None => layout.max_blocks(l).saturating_sub(shared),
        })
        .sum::<usize>()
        * layout.block_bytes()
}

impl<B: Backend> Drop for SequenceKv<B> {
    fn drop(&mut self) {
        let ids: Vec<_> = self.table.ids().collect();
        self.blocks.held().release(ids);
    }
}

#[cfg(test)]
#[path = "sequence_tests.rs"]
mod tests;
