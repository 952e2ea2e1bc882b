//! The backend's host tier: an evicted version goes there before disk.
//!
//! On a backend with memory of its own (a GPU), the registry's budget
//! bounds the bytes in device memory. A version evicted to make room is
//! demoted ([`switchyard_kernels::Backend::demote`]): its matrices move to
//! pinned host memory within the backend's host budget, the version stays
//! loaded (`host` in status and routing), and a request for it is queued
//! as for any loaded version: the executor prefetches its matrices on the
//! copy stream while other batches run, and runs it once they landed
//! (`serving/executor.rs`). When the host budget has no room, the least
//! recently used versions already there go to disk first; when it still
//! has none (or the backend has no host tier, as the CPU's), the version
//! goes to disk as before.
//!
//! Only an idle version (no request waiting or running) is demoted, so
//! that no step is reading it; one that is busy goes to disk, its memory
//! freed when its requests finish. Matrices it shares with other loaded
//! versions stay on the device for them.

use switchyard_kernels::{Backend, WeightTier};

use super::{Registry, State};
use crate::serving::{CheckpointHandle, CheckpointId};

impl<B: Backend> Registry<B> {
    /// Bytes of stored tensors in device memory (or RAM, on the CPU): the
    /// ones not demoted to the host tier.
    pub(super) fn device_bytes(&self) -> u64 {
        self.store
            .stats()
            .resident_bytes
            .saturating_sub(self.backend.host_tier_bytes())
    }

    /// Moves idle `id` into the backend's host tier; whether it went (see
    /// the module documentation).
    pub(super) fn demote(&self, id: &CheckpointId) -> bool {
        let Some(handle) = self.idle_handle(id) else {
            return false;
        };
        loop {
            match self.backend.demote(&handle.model.unshared_matrices()) {
                Ok(true) => break,
                Ok(false) => {
                    // Room first: the least recently used version there to disk.
                    let Some(older) = self.oldest_in_host_tier(id) else {
                        return false;
                    };
                    self.drop_to_disk(&older);
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %id, error = %e, "demotion to host memory failed");
                    return false;
                }
            }
        }
        handle.set_placement(WeightTier::Host);
        if let Some(slot) = self.read().get(&id.model).and_then(|m| m.slot(&id.version)) {
            slot.publish();
        }
        tracing::info!(checkpoint = %id, "evicted from device memory to the host tier");
        self.observer.unloaded(id, true);
        true
    }

    /// `id`'s handle when it is loaded and no request waits or runs on it.
    fn idle_handle(&self, id: &CheckpointId) -> Option<CheckpointHandle<B>> {
        let models = self.read();
        match &models.get(&id.model)?.slot(&id.version)?.state {
            State::Resident(h) if h.demand() == 0 => Some(h.clone()),
            _ => None,
        }
    }

    /// The idle version in the host tier (not `except`) used longest ago.
    fn oldest_in_host_tier(&self, except: &CheckpointId) -> Option<CheckpointId> {
        let models = self.read();
        models
            .values()
            .flat_map(|m| m.versions.iter())
            .filter_map(|slot| match &slot.state {
                State::Resident(h)
                    if h.id != *except
                        && h.demand() == 0
                        && h.placement() != WeightTier::Resident =>
                {
                    Some(h)
                }
                _ => None,
            })
            .max_by_key(|h| h.idle_for())
            .map(|h| h.id.clone())
    }

    /// `id` to disk: its handle dropped (its memory freed with the last
    /// holder).
    fn drop_to_disk(&self, id: &CheckpointId) {
        let mut models = self.write();
        if let Some(slot) = models
            .get_mut(&id.model)
            .and_then(|m| m.slot_mut(&id.version))
        {
            slot.set_state(State::Disk);
        }
        drop(models);
        tracing::info!(checkpoint = %id, "moved from the host tier to disk");
    }

    /// Asks the backend where the versions it last saw off the device are
    /// now (their copies up land while the executor runs).
    pub(super) fn refresh_placements(&self) {
        let models = self.read();
        for slot in models.values().flat_map(|m| m.versions.iter()) {
            if let State::Resident(h) = &slot.state {
                if h.placement() != WeightTier::Resident {
                    h.set_placement(self.backend.weight_tier(&h.model.weight_matrices()));
                }
            }
        }
    }
}
