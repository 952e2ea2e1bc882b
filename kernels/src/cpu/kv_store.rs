//! The CPU's KV store: blocks of host memory by [`BlockId`], and the
//! per-layer views attention reads and writes them through.
//!
//! A block holds, per KV head, the runs of its key blocks ([`KEY_BLOCK`]
//! positions each, attention's unit) one after another, so a head's part
//! of a block is one contiguous run that attention reads as a stream. A
//! key block's run holds its keys then its values:
//! - keys in tiles of [`KEY_TILE`](super::kv_layout::KEY_TILE) positions
//!   stored dimension-major (`[tile][head_dim][16]`), so that attention
//!   takes sixteen scores at once with one multiply-add per dimension and
//!   no horizontal sum (see `attention::scores`);
//! - values position after position (`[position][head_dim]`), the order
//!   the weighted sum reads them.
//!
//! Tasks of different KV heads therefore write apart. Elements are f32,
//! f16 (see `kv_elem`) or Q8_0 (`kv_q8`: per-position groups of int8 with
//! f16 scales, in a byte layout of their own that widens to the one above).
//!
//! Which sequence holds a block, whether it is shared and when it goes
//! are the engine's: the store allocates (fallibly: the engine reserved
//! the budget), frees and copies what it is told, and attention refuses a
//! call in which two sequences would write one block.

use half::f16;

use super::disjoint::DisjointSlice;
use super::kv_elem::KvElem;
use super::kv_q8::Q8Byte;
use crate::kv::{BlockId, BlockTable, KvBlockShape, KvType};
use crate::KernelError;

pub(crate) use super::kv_layout::KEY_BLOCK;

/// A block's elements, in its type.
#[derive(Debug)]
pub(crate) enum BlockData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<Q8Byte>),
}

#[derive(Debug)]
struct StoredBlock {
    shape: KvBlockShape,
    data: BlockData,
}

/// The blocks of one element type inside [`BlockData`].
pub(crate) trait Stored: KvElem {
    fn elems(data: &mut BlockData) -> Option<&mut Vec<Self>>;
    fn wrap(elems: Vec<Self>) -> BlockData;
}

impl Stored for f32 {
    fn elems(data: &mut BlockData) -> Option<&mut Vec<f32>> {
        match data {
            BlockData::F32(e) => Some(e),
            _ => None,
        }
    }

    fn wrap(elems: Vec<f32>) -> BlockData {
        BlockData::F32(elems)
    }
}

impl Stored for f16 {
    fn elems(data: &mut BlockData) -> Option<&mut Vec<f16>> {
        match data {
            BlockData::F16(e) => Some(e),
            _ => None,
        }
    }

    fn wrap(elems: Vec<f16>) -> BlockData {
        BlockData::F16(elems)
    }
}

impl Stored for Q8Byte {
    fn elems(data: &mut BlockData) -> Option<&mut Vec<Q8Byte>> {
        match data {
            BlockData::Q8_0(e) => Some(e),
            _ => None,
        }
    }

    fn wrap(elems: Vec<Q8Byte>) -> BlockData {
        BlockData::Q8_0(elems)
    }
}

fn refuse(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

/// Host memory of KV blocks (see the module documentation).
#[derive(Debug, Default)]
pub struct CpuKvStore {
    blocks: Vec<Option<StoredBlock>>,
    /// Slots of freed blocks, reused first.
    free: Vec<u32>,
}

impl CpuKvStore {
    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.blocks.len() - self.free.len()
    }

    /// Bytes of the blocks held now.
    pub fn bytes(&self) -> usize {
        self.blocks
            .iter()
            .flatten()
            .map(|b| b.shape.bytes().unwrap_or(0))
            .sum()
    }

    pub(crate) fn alloc(&mut self, shape: KvBlockShape) -> Result<BlockId, KernelError> {
        let bytes = shape
            .bytes()
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or(KernelError::KvAlloc { bytes: usize::MAX })?;
        if !shape.positions.is_multiple_of(KEY_BLOCK) || shape.positions == 0 {
            return Err(refuse(
                "kv_alloc",
                format!(
                    "a block of {} positions is not whole key blocks",
                    shape.positions
                ),
            ));
        }
        shape.dtype.check_head_dim(shape.head_dim)?;
        let data = match shape.dtype {
            KvType::F32 => zeroed::<f32>(&shape, bytes)?,
            KvType::F16 => zeroed::<f16>(&shape, bytes)?,
            KvType::Q8_0 => zeroed::<Q8Byte>(&shape, bytes)?,
        };
        let block = Some(StoredBlock { shape, data });
        let slot = match self.free.pop() {
            Some(slot) => {
                self.blocks[slot as usize] = block;
                slot
            }
            None => {
                let slot =
                    u32::try_from(self.blocks.len()).map_err(|_| KernelError::KvAlloc { bytes })?;
                self.blocks.push(block);
                slot
            }
        };
        Ok(BlockId(slot))
    }

    pub(crate) fn free(&mut self, id: BlockId) {
        if let Some(slot) = self.blocks.get_mut(id.0 as usize) {
            if slot.take().is_some() {
                self.free.push(id.0);
            }
        }
    }

    fn shape(&self, id: BlockId) -> Result<KvBlockShape, KernelError> {
        self.blocks
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .map(|b| b.shape)
            .ok_or_else(|| refuse("kv_store", format!("no block {id:?} in the store")))
    }

    /// Copies the first `positions` of every head's run of `from` to the
    /// start of `to`'s (see [`crate::Backend::kv_copy`]).
    pub(crate) fn copy(
        &mut self,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        let (a, b) = (self.shape(from)?, self.shape(to)?);
        let fits = from != to
            && a.dtype == b.dtype
            && a.n_kv_heads == b.n_kv_heads
            && a.head_dim == b.head_dim
            && positions.is_multiple_of(KEY_BLOCK)
            && positions <= a.positions.min(b.positions);
        if !fits {
            return Err(refuse(
                "kv_copy",
                format!("{positions} positions of a block {a:?} into a block {b:?}"),
            ));
        }
        let copied = match a.dtype {
            KvType::F32 => self.copy_runs::<f32>(from, to, positions),
            KvType::F16 => self.copy_runs::<f16>(from, to, positions),
            KvType::Q8_0 => self.copy_runs::<Q8Byte>(from, to, positions),
        };
        copied.ok_or_else(|| refuse("kv_copy", "a block's memory is not its shape's".into()))
    }

    fn copy_runs<E: Stored>(&mut self, from: BlockId, to: BlockId, positions: usize) -> Option<()> {
        let mut dst = self.blocks.get_mut(to.0 as usize)?.take()?;
        let copied = (|| {
            let src = self.blocks.get_mut(from.0 as usize)?.as_mut()?;
            let run_len = E::run_len(src.shape.head_dim);
            let (from_blocks, to_blocks) = (
                src.shape.positions / KEY_BLOCK,
                dst.shape.positions / KEY_BLOCK,
            );
            let len = positions / KEY_BLOCK * run_len;
            let src_elems = E::elems(&mut src.data)?;
            let dst_elems = E::elems(&mut dst.data)?;
            for head in 0..src.shape.n_kv_heads {
                let s = src_elems.get(head * from_blocks * run_len..)?.get(..len)?;
                let d = dst_elems
                    .get_mut(head * to_blocks * run_len..)?
                    .get_mut(..len)?;
                d.copy_from_slice(s);
            }
            Some(())
        })();
        self.blocks[to.0 as usize] = Some(dst);
        copied
    }

    /// Layer `layer`'s blocks of each of `seqs` (its table, and the
    /// positions it writes), as views whose KV heads tasks of one job can
    /// write and read apart. Fails where a table names a block not in the
    /// store or not of the table's layout, or where a block one sequence
    /// writes is in another's table.
    pub(crate) fn layer_heads<E: Stored>(
        &mut self,
        layer: usize,
        seqs: &[(&BlockTable, std::ops::Range<usize>)],
    ) -> Result<Vec<LayerHeads<'_, E>>, KernelError> {
        // (block, the sequence writing it), sorted by block.
        let mut writers: Vec<(BlockId, usize)> = Vec::new();
        for (s, (table, writes)) in seqs.iter().enumerate() {
            let step = table.layout().block_positions().max(1);
            let mut p = writes.start;
            while p < writes.end {
                if let Some(&id) = table.layer(layer).get(table.index_of(layer, p)) {
                    writers.push((id, s));
                }
                p = (p / step + 1) * step;
            }
        }
        writers.sort_unstable();
        writers.dedup();
        if let Some(pair) = writers.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(shared_write(pair[0].0));
        }
        if !writers.is_empty() && seqs.len() > 1 {
            for (s, (table, _)) in seqs.iter().enumerate() {
                for id in table.layer(layer) {
                    if let Ok(at) = writers.binary_search_by_key(id, |w| w.0) {
                        if writers[at].1 != s {
                            return Err(shared_write(*id));
                        }
                    }
                }
            }
        }
        let mut views = Vec::with_capacity(seqs.len());
        for (table, _) in seqs {
            let layout = table.layout();
            let want = layout.block_shape(layout.block_positions());
            let mut blocks = Vec::with_capacity(table.layer(layer).len());
            for id in table.layer(layer) {
                let block = self
                    .blocks
                    .get_mut(id.0 as usize)
                    .and_then(Option::as_mut)
                    .ok_or_else(|| refuse("attention", format!("no block {id:?} in the store")))?;
                if block.shape != want {
                    return Err(refuse(
                        "attention",
                        format!(
                            "block {id:?} is {:?}, the table's layout {want:?}",
                            block.shape
                        ),
                    ));
                }
                let elems = E::elems(&mut block.data).ok_or_else(|| {
                    refuse(
                        "attention",
                        format!("block {id:?} is not of the call's type"),
                    )
                })?;
                // SAFETY: the pointer stays valid while the store is
                // borrowed (the views' lifetime): blocks are neither freed
                // nor moved meanwhile. A block in several views is written
                // by at most one of them (checked above) and the job's
                // tasks write only their own KV head's runs.
                blocks.push(unsafe { DisjointSlice::from_raw(elems.as_mut_ptr(), elems.len()) });
            }
            views.push(LayerHeads {
                blocks,
                head_dim: layout.head_dim(),
                key_blocks: layout.block_positions() / KEY_BLOCK,
                ring: layout.max_blocks(layer),
            });
        }
        Ok(views)
    }
}

fn shared_write(id: BlockId) -> KernelError {
    refuse(
        "attention",
        format!("block {id:?} is written by one sequence of the call and read by another"),
    )
}

fn zeroed<E: Stored>(shape: &KvBlockShape, bytes: usize) -> Result<BlockData, KernelError> {
    let len = shape.n_kv_heads * (shape.positions / KEY_BLOCK) * E::run_len(shape.head_dim);
    let mut elems: Vec<E> = Vec::new();
    elems
        .try_reserve_exact(len)
        .map_err(|_| KernelError::KvAlloc { bytes })?;
    elems.resize(len, E::default());
    Ok(E::wrap(elems))
}

/// One layer of a sequence's blocks, split by KV head: the attention
/// job's task for a KV head of a one-tile sequence (a decode step) writes
/// that head's new keys and values itself and then reads them, so the
/// writes run in parallel instead of before the job on the calling thread.
pub(crate) struct LayerHeads<'a, E> {
    blocks: Vec<DisjointSlice<'a, E>>,
    head_dim: usize,
    /// Blocks the layer may hold: position `p` lives in block
    /// `(p / block_positions) % ring`.
    ring: usize,
    /// Key blocks per block.
    key_blocks: usize,
}

impl<E: KvElem> LayerHeads<'_, E> {
    /// Key blocks the layer cycles through (a windowed layer's ring, else
    /// enough for the whole capacity): position `p` lives in key block
    /// `(p / KEY_BLOCK) % ring()`.
    pub(crate) fn ring(&self) -> usize {
        self.ring * self.key_blocks
    }

    /// Key blocks per block (one allocation).
    pub(crate) fn key_blocks(&self) -> usize {
        self.key_blocks
    }

    /// Elements of one KV head's run of a key block.
    fn run_len(&self) -> usize {
        E::run_len(self.head_dim)
    }

    /// Where `head`'s run of key block `key_block` (of the ring) lies: its
    /// block, and the offset in it.
    fn run_at(&self, head: usize, key_block: usize) -> (usize, usize) {
        let in_block = key_block % self.key_blocks;
        let at = (head * self.key_blocks + in_block) * self.run_len();
        (key_block / self.key_blocks, at)
    }

    /// Stores `head`'s `key` and `value` (`head_dim` each) at `position`,
    /// rounded to `E`, in its block (in the table: the caller checked).
    ///
    /// # Safety
    /// No other thread may read or write `head` of this layer meanwhile.
    pub(crate) unsafe fn write(&self, head: usize, position: usize, key: &[f32], value: &[f32]) {
        let (block, at) = self.run_at(head, (position / KEY_BLOCK) % self.ring().max(1));
        // SAFETY: the run belongs to `head`, which the caller holds alone.
        let run = unsafe { self.blocks[block].range(at, self.run_len()) };
        E::store(run, position % KEY_BLOCK, key, value);
    }

    /// `head`'s run of key block `key_block` (of the ring): two key tiles,
    /// then [`KEY_BLOCK`] values.
    ///
    /// # Safety
    /// No thread may write `head` of this layer while the borrow lives.
    pub(crate) unsafe fn key_block(&self, head: usize, key_block: usize) -> &[E] {
        let (block, at) = self.run_at(head, key_block);
        // SAFETY: the caller's promise.
        unsafe { self.blocks[block].get(at, self.run_len()) }
    }

    /// Key blocks in the table (the caller checks that reads stay below).
    pub(crate) fn allocated(&self) -> usize {
        self.blocks.len() * self.key_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kv_cache::{key, value};
    use crate::kv::{KvFormat, KvLayout};

    /// A block of `dtype` (2 KV heads of 64, `positions`) with a tag at
    /// every position's keys and values (what attention would have written).
    fn written(store: &mut CpuKvStore, dtype: KvType, positions: usize) -> BlockTable {
        let layout =
            KvLayout::new(KvFormat::new(dtype, positions), 1, 2, 64, positions, &[]).unwrap();
        let mut table = BlockTable::new(layout.clone());
        let id = store.alloc(layout.block_shape(positions)).unwrap();
        table.push(0, id).unwrap();
        let views = store.layer_heads::<f32>(0, &[(&table, 0..positions)]);
        if dtype == KvType::F32 {
            let heads = &views.unwrap()[0];
            for p in 0..positions {
                for h in 0..2 {
                    let k: Vec<f32> = (0..64).map(|d| (p * 64 + d + h) as f32).collect();
                    let v: Vec<f32> = k.iter().map(|x| -x).collect();
                    // SAFETY: one thread, the view lives here.
                    unsafe { heads.write(h, p, &k, &v) };
                }
            }
        }
        table
    }

    #[test]
    fn a_copy_carries_the_first_positions_of_every_head_into_a_block_of_another_length() {
        let mut store = CpuKvStore::default();
        let long = written(&mut store, KvType::F32, 4 * KEY_BLOCK);
        let tail = written(&mut store, KvType::F32, KEY_BLOCK);
        let (from, to) = (long.layer(0)[0], tail.layer(0)[0]);
        store.copy(from, to, KEY_BLOCK).unwrap();
        for h in 0..2 {
            for p in [0, 17, KEY_BLOCK - 1] {
                assert_eq!(
                    key(&mut store, &tail, 0, h, p),
                    key(&mut store, &long, 0, h, p)
                );
                assert_eq!(
                    value(&mut store, &tail, 0, h, p),
                    value(&mut store, &long, 0, h, p)
                );
            }
        }
        // Half a unit, more than a block holds, a block onto itself, or
        // blocks of another type are refused.
        assert!(store.copy(from, to, 16).is_err());
        assert!(store.copy(from, to, 2 * KEY_BLOCK).is_err());
        assert!(store.copy(from, from, KEY_BLOCK).is_err());
        let f16 = written(&mut store, KvType::F16, KEY_BLOCK);
        assert!(store.copy(from, f16.layer(0)[0], KEY_BLOCK).is_err());
    }

    #[test]
    fn freed_ids_are_reused_and_their_memory_comes_back_zeroed() {
        let mut store = CpuKvStore::default();
        let table = written(&mut store, KvType::F32, KEY_BLOCK);
        let id = table.layer(0)[0];
        assert_eq!(
            (store.blocks(), store.bytes()),
            (1, 2 * 2 * KEY_BLOCK * 64 * 4)
        );
        store.free(id);
        store.free(id);
        assert_eq!((store.blocks(), store.bytes()), (0, 0));
        let again = store.alloc(table.layout().block_shape(KEY_BLOCK)).unwrap();
        assert_eq!(again, id);
        assert_eq!(key(&mut store, &table, 0, 1, 5), vec![0.0; 64]);
        let odd = KvBlockShape {
            positions: 40,
            ..table.layout().block_shape(KEY_BLOCK)
        };
        assert!(store.alloc(odd).is_err(), "not whole key blocks");
    }
}
