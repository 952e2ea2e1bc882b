//! The device's KV blocks as the engine holds them: the backend's store,
//! and how many holders each block has.
//!
//! Every block in a sequence's table and every block a [`SharedBlock`]
//! names counts one holder; a block goes back to the store when its last
//! holder lets go. A sequence writes only blocks it holds alone: a block
//! the prompt cache or another sequence also holds is read-only.
//!
//! Lock order: the store's lock is taken alone, for one allocation or
//! release, or for one forward pass ([`KvBlocks::lock`]); nothing that
//! drops a [`SequenceKv`] or a [`SharedBlock`] runs while it is held.
//!
//! [`SharedBlock`]: super::SharedBlock
//! [`SequenceKv`]: super::SequenceKv

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use switchyard_kernels::{Backend, BlockId, KvBlockShape};

use super::budget::KvPool;
use super::KvError;

/// The KV blocks of one budget on one device.
pub struct KvBlocks<B: Backend> {
    pool: Arc<KvPool>,
    inner: Mutex<Held<B>>,
}

pub(super) struct Held<B: Backend> {
    store: B::KvStore,
    holders: HashMap<BlockId, u32>,
}

impl<B: Backend> KvBlocks<B> {
    /// An empty store on `backend` for the blocks `pool` budgets.
    pub fn new(backend: &B, pool: &Arc<KvPool>) -> Result<Arc<KvBlocks<B>>, KvError> {
        let store = backend.kv_store(pool.format(), pool.budget_bytes())?;
        Ok(Arc::new(KvBlocks {
            pool: Arc::clone(pool),
            inner: Mutex::new(Held {
                store,
                holders: HashMap::new(),
            }),
        }))
    }

    /// The budget its blocks reserve from.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    /// The store, for one forward pass over tables of its blocks.
    pub fn lock(&self) -> KvStoreGuard<'_, B> {
        KvStoreGuard(self.held())
    }

    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.held().holders.len()
    }

    pub(super) fn held(&self) -> MutexGuard<'_, Held<B>> {
        // A panic while the lock was held left counts that are still
        // whole: each change is one map operation.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<B: Backend> Held<B> {
    /// A new block of one holder.
    pub(super) fn alloc(&mut self, backend: &B, shape: KvBlockShape) -> Result<BlockId, KvError> {
        let id = backend.kv_alloc(&mut self.store, shape)?;
        self.holders.insert(id, 1);
        Ok(id)
    }

    /// One more holder of `id`.
    pub(super) fn hold(&mut self, id: BlockId) {
        *self.holders.entry(id).or_insert(0) += 1;
    }

    /// One holder less of each of `ids`; a block without holders goes
    /// back to the store.
    pub(super) fn release(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            if let Some(count) = self.holders.get_mut(&id) {
                *count -= 1;
                if *count == 0 {
                    self.holders.remove(&id);
                    B::kv_free(&mut self.store, id);
                }
            }
        }
    }

    /// Holders of `id` (0: not held).
    pub(super) fn holders(&self, id: BlockId) -> u32 {
        self.holders.get(&id).copied().unwrap_or(0)
    }

    pub(super) fn copy(
        &mut self,
        backend: &B,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KvError> {
        Ok(backend.kv_copy(&mut self.store, from, to, positions)?)
    }
}

/// The store, locked for a forward pass.
pub struct KvStoreGuard<'a, B: Backend>(MutexGuard<'a, Held<B>>);

impl<B: Backend> Deref for KvStoreGuard<'_, B> {
    type Target = B::KvStore;

    fn deref(&self) -> &B::KvStore {
        &self.0.store
    }
}

impl<B: Backend> DerefMut for KvStoreGuard<'_, B> {
    fn deref_mut(&mut self) -> &mut B::KvStore {
        &mut self.0.store
    }
}
