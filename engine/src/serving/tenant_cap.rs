//! Per-tenant caps on what the engine holds for one tenant (issue 32).
//!
//! Fair admission (`fair.rs`) shares batch slots by weight, but a slot can hold a
//! cache of any size: a tenant flooding long `max_tokens` requests still reserved
//! the whole KV budget and every other tenant waited until those sequences ended.
//! So each tenant (`TenantShare::kv_permille`, from the policy's `kv_share`) has
//! a part of the KV budget its running sequences may reserve together, and a part
//! of the waiting queue its requests may fill:
//!
//! - past its KV part, its next request waits while other tenants' requests pass
//!   it (it is not the blocked head of the line: only its own sequences ending can
//!   make room for it);
//! - past its queue part, a new request is refused at submit (429), while other
//!   tenants can still queue;
//! - a request whose caches alone exceed its tenant's KV part is refused at submit
//!   (400), since it could never run.
//!
//! Requests of a tenant without a cap (`kv_permille` 1000: no policy, a policy of
//! one tenant) are not counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use switchyard_seam::TenantShare;

/// KV bytes the running sequences of each tenant reserve, against the budget.
pub(super) struct TenantKv {
    budget: usize,
    held: HashMap<Option<Arc<str>>, usize>,
}

impl TenantKv {
    /// Nothing held yet of a budget of `budget` bytes.
    pub(super) fn new(budget: usize) -> Self {
        TenantKv {
            budget,
            held: HashMap::new(),
        }
    }

    /// A running sequence of `tenant` reserves `bytes`.
    pub(super) fn add(&mut self, tenant: &Option<Arc<str>>, bytes: usize) {
        let held = self.held.entry(tenant.clone()).or_default();
        *held = held.saturating_add(bytes);
    }

    /// Bytes `tenant`'s running sequences reserve.
    pub(super) fn held(&self, tenant: &Option<Arc<str>>) -> usize {
        self.held.get(tenant).copied().unwrap_or(0)
    }

    /// Whether a cache of `bytes` more stays within the part of the budget `share`
    /// allows its tenant.
    pub(super) fn fits(&self, share: &TenantShare, bytes: usize) -> bool {
        self.held(&share.tenant).saturating_add(bytes) <= share.part_of(self.budget)
    }
}

/// Waiting requests of each capped tenant, counted at submit (on the caller's
/// thread) and given back when the request leaves the queue, however it leaves
/// (its [`QueueTicket`] drops).
#[derive(Default)]
pub(super) struct TenantQueue {
    waiting: Mutex<HashMap<Arc<str>, usize>>,
}

/// A tenant's queue part is full: `waiting` of its requests wait, its part is `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueueFull {
    pub(super) waiting: usize,
    pub(super) limit: usize,
}

impl TenantQueue {
    /// A place in the queue for a request of `share`, whose tenant may fill its part
    /// of `max_queued` places; `None` for a tenant without a cap.
    pub(super) fn enter(
        self: &Arc<Self>,
        share: &TenantShare,
        max_queued: usize,
    ) -> Result<Option<QueueTicket>, QueueFull> {
        if share.kv_permille >= TenantShare::WHOLE {
            return Ok(None);
        }
        // No tenant name is empty (the policy refuses one).
        let key = share.tenant.clone().unwrap_or_else(|| Arc::from(""));
        let limit = share.part_of(max_queued);
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let count = waiting.entry(Arc::clone(&key)).or_default();
        if *count >= limit {
            return Err(QueueFull {
                waiting: *count,
                limit,
            });
        }
        *count += 1;
        Ok(Some(QueueTicket {
            queue: Arc::clone(self),
            key,
        }))
    }
}

/// One waiting request's place in its tenant's part of the queue.
pub(super) struct QueueTicket {
    queue: Arc<TenantQueue>,
    /// The tenant's name ("" for requests without a tenant).
    key: Arc<str>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut waiting = self.queue.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = waiting.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_fits_within_its_part_of_the_budget_only() {
        let half = TenantShare::new("a", 1).with_kv_permille(500);
        let other = TenantShare::new("b", 1).with_kv_permille(500);
        let mut kv = TenantKv::new(1000);
        assert!(kv.fits(&half, 500));
        assert!(!kv.fits(&half, 501));
        kv.add(&half.tenant, 400);
        assert!(kv.fits(&half, 100));
        assert!(!kv.fits(&half, 101));
        // Another tenant's part is its own.
        assert!(kv.fits(&other, 500));
        // Without a cap, the whole budget.
        let whole = TenantShare::new("c", 1);
        assert!(kv.fits(&whole, 1000));
    }

    #[test]
    fn a_tenant_fills_its_part_of_the_queue_and_leaving_frees_a_place() {
        let queue = Arc::new(TenantQueue::default());
        let quarter = TenantShare::new("a", 1).with_kv_permille(250);
        let first = queue.enter(&quarter, 8).unwrap();
        let second = queue.enter(&quarter, 8).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(
            queue.enter(&quarter, 8).err(),
            Some(QueueFull {
                waiting: 2,
                limit: 2
            })
        );
        // Another tenant still queues; an uncapped one is not counted.
        let other = TenantShare::new("b", 1).with_kv_permille(250);
        assert!(queue.enter(&other, 8).unwrap().is_some());
        assert!(queue.enter(&TenantShare::default(), 8).unwrap().is_none());
        drop(first);
        assert!(queue.enter(&quarter, 8).is_ok());
    }

    #[test]
    fn parts_round_down_but_never_to_nothing() {
        let share = TenantShare::new("a", 1).with_kv_permille(1);
        assert_eq!(share.part_of(10), 1);
        assert_eq!(share.part_of(usize::MAX), usize::MAX / 1000);
        let half = TenantShare::new("a", 1).with_kv_permille(500);
        assert_eq!(half.part_of(1001), 500);
        assert_eq!(TenantShare::default().part_of(7), 7);
    }
}
