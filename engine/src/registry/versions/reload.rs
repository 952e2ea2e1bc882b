//! Loading an evicted adapter again, off the request's path.
//!
//! A request for an adapter version the budget evicted (`adapters.rs`)
//! queues one background load of it (however many requests ask) and is
//! answered at once with [`RegistryErrorKind::Unavailable`] (503 with
//! `Retry-After` over HTTP; the official OpenAI clients retry it by
//! themselves): the request holds no worker thread, no connection slot and
//! no lock while the adapter loads, and other requests go on. While the
//! load is queued or running the version reads as loading (status, routing,
//! `waiting_lora_adapters` in the metrics). When the budget is held by
//! adapters in use, the load waits for room (polling, up to
//! [`ROOM_PATIENCE`]) instead of failing, so the adapter comes in as soon
//! as one of them finishes.
//!
//! [`RegistryErrorKind::Unavailable`]: crate::registry::RegistryErrorKind::Unavailable

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_kernels::Backend;
use switchyard_seam::ModelSpec;

use super::Registry;
use crate::registry::error::{RegistryError, RegistryErrorKind};
use crate::serving::{CheckpointHandle, CheckpointId};

/// How long a queued reload waits for room in the adapter budget before it
/// gives up (the next request queues it again).
const ROOM_PATIENCE: Duration = Duration::from_secs(60);

/// How often a reload waiting for room looks again.
const ROOM_POLL: Duration = Duration::from_millis(100);

impl<B: Backend> Registry<B> {
    /// The resident checkpoint `spec` names now; for an adapter version the
    /// budget evicted, its reload queued in the background and an
    /// `Unavailable` error saying so (see the module's comment).
    pub fn resolve_or_reload(
        self: &Arc<Self>,
        spec: &ModelSpec,
    ) -> Result<CheckpointHandle<B>, RegistryError> {
        let error = match self.resolve_spec(spec) {
            Ok(handle) => return Ok(handle),
            Err(error) => error,
        };
        let Some((id, bytes, queued)) = self.queue_reload(spec) else {
            return Err(error);
        };
        let room = self.adapter_room(&id, bytes);
        if queued {
            let registry = Arc::clone(self);
            let reload_id = id.clone();
            let spawned = std::thread::Builder::new()
                .name("adapter-reload".into())
                .spawn(move || registry.reload(&reload_id, bytes));
            if let Err(error) = spawned {
                self.end_reload(&id);
                return Err(RegistryError::unavailable(format!(
                    "{id} was evicted by the adapter budget and cannot be loaded again now \
                     ({error}); retry in a moment"
                )));
            }
            tracing::info!(adapter = %id, "evicted adapter asked for: loading it again");
        }
        Err(match room {
            Err(full) => RegistryError::unavailable(format!(
                "{}; it loads as soon as there is room",
                full.message
            )),
            Ok(()) => RegistryError::unavailable(format!(
                "{id} was evicted by the adapter budget (least recently used) and is being \
                 loaded again; retry in a moment"
            )),
        })
    }

    /// Marks the evicted adapter version `spec` names as reloading: its id,
    /// the bytes it needs from the budget, and whether this call queued it
    /// (`false`: a reload is queued already). `None` if `spec` names no
    /// evicted adapter.
    fn queue_reload(&self, spec: &ModelSpec) -> Option<(CheckpointId, u64, bool)> {
        let mut models = self.write();
        let name = if models.contains_key(spec.name()) {
            spec.name().to_owned()
        } else {
            let (name, _) =
                (models.iter()).find(|(_, m)| m.aliases.iter().any(|a| a == spec.name()))?;
            name.clone()
        };
        let model = models.get_mut(&name)?;
        let version = spec.version().or(model.active.as_deref())?.to_owned();
        let slot = model.slot_mut(&version)?;
        if !slot.evicted {
            return None;
        }
        let queued = !slot.reload_pending;
        slot.reload_pending = true;
        slot.publish();
        Some((
            CheckpointId::new(&name, &version),
            slot.evicted_bytes,
            queued,
        ))
    }

    /// The background load of `id` (queued by [`Registry::resolve_or_reload`]).
    fn reload(&self, id: &CheckpointId, bytes: u64) {
        let give_up = Instant::now() + ROOM_PATIENCE;
        loop {
            let outcome = match self.adapter_room(id, bytes) {
                Ok(()) => self.load(&id.model, &id.version).map(|_| ()),
                Err(full) => Err(full),
            };
            match outcome {
                Ok(()) => break,
                // The budget is held by adapters in use (or a load raced
                // this one for the room): wait for them to finish.
                Err(error)
                    if error.kind == RegistryErrorKind::Unavailable && Instant::now() < give_up =>
                {
                    std::thread::sleep(ROOM_POLL);
                }
                Err(error) => {
                    tracing::warn!(adapter = %id, %error, "loading an evicted adapter again failed");
                    break;
                }
            }
        }
        self.end_reload(id);
    }

    /// Clears `id`'s queued reload.
    fn end_reload(&self, id: &CheckpointId) {
        let mut models = self.write();
        if let Some(slot) = models
            .get_mut(&id.model)
            .and_then(|m| m.slot_mut(&id.version))
        {
            slot.reload_pending = false;
            slot.publish();
        }
    }
}
