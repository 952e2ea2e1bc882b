//! One sequence's blocks with a store of their own, for the kernels'
//! unit tests: what the engine's `SequenceKv` does with a backend's store,
//! in miniature (allocate the blocks positions land in, read back what
//! attention wrote).

use half::f16;

use super::kv_layout::{key_at, value_at, KEY_BLOCK, KEY_TILE};
use super::kv_q8::Q8Byte;
use super::kv_store::{CpuKvStore, Stored};
use crate::kv::{BlockTable, KvFormat, KvLayout, KvType};
use crate::{AttentionRows, KernelError};

/// Allocates `table`'s blocks of every layer for positions `0..end`.
pub(crate) fn grow(
    store: &mut CpuKvStore,
    table: &mut BlockTable,
    end: usize,
) -> Result<(), KernelError> {
    let shape = table.layout().block_shape(table.layout().block_positions());
    for layer in 0..table.layout().layers() {
        while table.layer(layer).len() < table.blocks_for(layer, end) {
            let id = store.alloc(shape)?;
            table.push(layer, id)?;
        }
    }
    Ok(())
}

/// `head`'s key at `position` of `layer`, widened to f32.
pub(crate) fn key(
    store: &mut CpuKvStore,
    table: &BlockTable,
    layer: usize,
    head: usize,
    position: usize,
) -> Vec<f32> {
    let hd = table.layout().head_dim();
    let at = key_at(position % KEY_BLOCK, hd);
    head_run(store, table, layer, head, position)
        .into_iter()
        .skip(at)
        .step_by(KEY_TILE)
        .take(hd)
        .collect()
}

/// `head`'s value at `position` of `layer`, widened to f32.
pub(crate) fn value(
    store: &mut CpuKvStore,
    table: &BlockTable,
    layer: usize,
    head: usize,
    position: usize,
) -> Vec<f32> {
    let hd = table.layout().head_dim();
    let at = value_at(position % KEY_BLOCK, hd);
    head_run(store, table, layer, head, position)[at..at + hd].to_vec()
}

/// The f32 copy of `head`'s run of the key block holding `position`.
fn head_run(
    store: &mut CpuKvStore,
    table: &BlockTable,
    layer: usize,
    head: usize,
    position: usize,
) -> Vec<f32> {
    fn widen<E: Stored>(
        store: &mut CpuKvStore,
        table: &BlockTable,
        l: usize,
        h: usize,
        p: usize,
    ) -> Vec<f32> {
        let views = store
            .layer_heads::<E>(l, &[(table, 0..0)])
            .expect("the table's blocks were allocated in this store by `grow`");
        let heads = &views[0];
        let b = (p / KEY_BLOCK) % heads.ring();
        // SAFETY: nothing writes meanwhile.
        let run = unsafe { heads.key_block(h, b) };
        let mut scratch = Vec::new();
        E::widen(
            crate::cpu::isa::CheckedIsa::at_most(crate::cpu::Isa::Scalar),
            run,
            &mut scratch,
        )
        .to_vec()
    }
    match table.layout().dtype() {
        KvType::F32 => widen::<f32>(store, table, layer, head, position),
        KvType::F16 => widen::<f16>(store, table, layer, head, position),
        KvType::Q8_0 => widen::<Q8Byte>(store, table, layer, head, position),
    }
}

/// A sequence's table and a store holding only its blocks.
#[derive(Debug)]
pub(crate) struct CpuKvCache {
    pub(crate) store: CpuKvStore,
    pub(crate) table: BlockTable,
}

impl CpuKvCache {
    /// A cache of `format` whose layer `l` keeps a ring for `windows[l]`
    /// when that is `Some`.
    pub(crate) fn windowed(
        format: &KvFormat,
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
    ) -> Result<Self, KernelError> {
        let layout = KvLayout::new(*format, layers, n_kv_heads, head_dim, capacity, windows)?;
        Ok(CpuKvCache {
            store: CpuKvStore::default(),
            table: BlockTable::new(layout),
        })
    }

    pub(crate) fn layout(&self) -> &KvLayout {
        self.table.layout()
    }

    /// Allocates every layer's blocks for positions `0..end`.
    pub(crate) fn grow(&mut self, end: usize) -> Result<(), KernelError> {
        grow(&mut self.store, &mut self.table, end)
    }

    /// Rows `rows` at `start_pos` (of a prompt where `prompt`, see
    /// [`AttentionRows::prompt`]), its blocks allocated first.
    pub(crate) fn rows(
        &mut self,
        rows: std::ops::Range<usize>,
        start_pos: usize,
        prompt: bool,
    ) -> Result<(&mut CpuKvStore, AttentionRows<'_>), KernelError> {
        self.grow(start_pos + rows.len())?;
        Ok((
            &mut self.store,
            AttentionRows {
                table: &self.table,
                rows,
                start_pos,
                prompt,
            },
        ))
    }

    /// Bytes of the blocks allocated so far.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.store.bytes()
    }

    /// Bytes of the blocks `layer` holds.
    pub(crate) fn layer_allocated_bytes(&self, layer: usize) -> usize {
        self.table.layer(layer).len() * self.layout().block_bytes()
    }

    /// Stores `key` and `value` (each `n_kv_heads × head_dim`) at
    /// `position` of `layer`, whose block is allocated.
    pub(crate) fn write<E: Stored>(
        &mut self,
        layer: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), KernelError> {
        let hd = self.layout().head_dim();
        let views = self
            .store
            .layer_heads::<E>(layer, &[(&self.table, position..position + 1)])?;
        let heads = &views[0];
        for head in 0..self.table.layout().n_kv_heads() {
            let span = head * hd..(head + 1) * hd;
            // SAFETY: the view lives only in this call.
            unsafe { heads.write(head, position, &key[span.clone()], &value[span]) };
        }
        Ok(())
    }

    pub(crate) fn key(&mut self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        key(&mut self.store, &self.table, layer, head, position)
    }

    pub(crate) fn value(&mut self, layer: usize, head: usize, position: usize) -> Vec<f32> {
        value(&mut self.store, &self.table, layer, head, position)
    }
}
