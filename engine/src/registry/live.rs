//! A checkpoint's routing state, published by the registry at every change
//! and readable without its lock: routing asks about every candidate of
//! every request, and a lookup under the registry's lock per candidate
//! (hash, lock, scan) cost more than the rest of the routing decision.

use std::sync::Arc;

use arc_swap::ArcSwap;
use switchyard_kernels::Backend;

use super::status::{RoutingState, Tier};
use crate::serving::CheckpointHandle;

/// One version's live routing state (see [`super::Registry::live`]).
pub struct LiveSlot<B: Backend> {
    current: ArcSwap<Published<B>>,
}

struct Published<B: Backend> {
    tier: Tier,
    bytes: u64,
    /// Present while resident: its queue is read live.
    handle: Option<CheckpointHandle<B>>,
}

impl<B: Backend> LiveSlot<B> {
    /// A version on disk of `bytes`.
    pub(super) fn on_disk(bytes: u64) -> Self {
        LiveSlot {
            current: ArcSwap::from_pointee(Published {
                tier: Tier::Disk,
                bytes,
                handle: None,
            }),
        }
    }

    /// Publishes a new tier; `handle` while resident.
    pub(super) fn publish(&self, tier: Tier, bytes: u64, handle: Option<CheckpointHandle<B>>) {
        self.current.store(Arc::new(Published {
            tier,
            bytes,
            handle,
        }));
    }

    /// The state now: tier, bytes, and the requests waiting.
    pub fn routing_state(&self) -> RoutingState {
        let now = self.current.load();
        // A loaded version's matrices move between device and host memory
        // without the registry (the executor prefetches them).
        let tier = match &now.handle {
            Some(h) => Tier::loaded::<B>(h.placement()),
            None => now.tier,
        };
        RoutingState {
            tier,
            bytes: now.bytes,
            queued: now.handle.as_ref().map_or(0, |h| h.queued()),
        }
    }
}
