//! The policy the router routes with: a [`PolicyStore`] plus live engine state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_policies::{
    metrics, EngineView, PolicyStore, RateLedger, Route, RouteError, RouteRequest,
};

use crate::policy::engine_view::BackendEngineView;
use switchyard_seam::InferenceBackend;

/// What the policy layer routes with. Shared by `Arc` between the layer, in-flight
/// requests (for fallbacks) and whoever reloads the store (watcher, admin API).
pub struct PolicyRouting {
    store: Arc<PolicyStore>,
    engine: Arc<dyn EngineView + Send + Sync>,
    /// The store generation whose metrics were last published, so a reload (from the
    /// watcher, the admin API or anywhere else) shows every split's state and every
    /// tenant's spend.
    published: AtomicU64,
    /// Requests and tokens each tenant and key used this minute; outside the policy,
    /// so a reload changes the limits and keeps the counts.
    rate_ledger: Arc<dyn RateLedger>,
}

impl PolicyRouting {
    /// Routes with `store`, scoring against `engine`.
    pub fn new(store: Arc<PolicyStore>, engine: Arc<dyn EngineView + Send + Sync>) -> Self {
        // The process's recorder before any handle is registered: a handle taken from no
        // recorder would count nothing for the policy's whole life.
        let _ = crate::metrics::Metrics::global();
        // Rate limits live where spend does when instances share it (Redis), so
        // that they hold across instances; else in this process.
        let rate_ledger = switchyard_policies::rate_ledger_for(store.current().ledger());
        let routing = PolicyRouting {
            store,
            engine,
            published: AtomicU64::new(0),
            rate_ledger,
        };
        routing.publish_metrics();
        routing
    }

    /// Routes with `store`, scoring against the backend's
    /// [`InferenceBackend::checkpoint_state`].
    pub fn over_backend(store: Arc<PolicyStore>, backend: Arc<dyn InferenceBackend>) -> Self {
        Self::new(store, Arc::new(BackendEngineView::new(backend)))
    }

    /// Counts rate limits in `ledger` (one shared between instances) instead of this
    /// process's memory.
    pub fn with_rate_ledger(mut self, ledger: Arc<dyn RateLedger>) -> Self {
        self.rate_ledger = ledger;
        self
    }

    /// Where rate limits are counted.
    pub fn rate_ledger(&self) -> &dyn RateLedger {
        self.rate_ledger.as_ref()
    }

    /// The policy store (reload it, read the current policy).
    pub fn store(&self) -> &Arc<PolicyStore> {
        &self.store
    }

    /// Routes `request` with the current policy.
    pub fn route(&self, request: &RouteRequest) -> Result<Route, RouteError> {
        if self.published.load(Ordering::Acquire) != self.store.generation() {
            self.publish_metrics();
        }
        self.store.route(request, self.engine.as_ref())
    }

    /// Whether `key` belongs to a tenant of the current policy (constant-time compare).
    pub fn knows_key(&self, key: &str) -> bool {
        self.store.current().authenticate(key).is_some()
    }

    /// Whether the current policy routes requests without an API key.
    pub fn allows_anonymous(&self) -> bool {
        self.store.current().routing().allow_anonymous
    }

    /// Sets `switchyard_policy_rollback_tripped` for every split with a rule, so the
    /// gauge exists (at 0) before a rule ever trips, and after reloads; registers every
    /// tenant's spend counters (at 0), so that no tenant's first request after a reload
    /// pays for it (a thousand tenants take a few milliseconds, once per reload).
    fn publish_metrics(&self) {
        let generation = self.store.generation();
        let policy = self.store.current();
        policy.register_metrics();
        for status in policy.rollback_status() {
            let tripped = !matches!(status.state, switchyard_policies::RollbackState::Watching);
            ::metrics::gauge!(metrics::ROLLBACK_TRIPPED, "split" => status.split).set(if tripped {
                1.0
            } else {
                0.0
            });
        }
        self.published.store(generation, Ordering::Release);
    }
}
