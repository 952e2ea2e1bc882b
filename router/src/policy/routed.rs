//! The typed result of routing, handed to the inference handlers.
//!
//! The policy layer puts a [`RoutedRequest`] in the request's extensions; handlers take
//! it as an extractor, which fails closed (500) when it is missing, so a handler cannot
//! serve a request the policy did not route. With no policy configured the layer hands
//! out [`RoutedRequest::passthrough`], which uses the request's `model` as is.
//!
//! A routed request owns the routing decision until the request ends: the handler
//! reports the outcome ([`RoutedRequest::succeeded`], [`RoutedRequest::failed`]), or the
//! stream it returns does (`openai/tail/settle.rs`); that settles the
//! budget with the engine's token counts and feeds the split's rollback rule. A request
//! that ends without a report (dropped) releases its reservation.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use axum::extract::FromRequestParts;
use http::request::Parts;
use switchyard_policies::{Completion, ModelHint, Route, RouteReason, RouteRequest, Usage};

use crate::policy::error::PolicyRejection;
use crate::policy::routing::PolicyRouting;
use switchyard_seam::{BackendError, CacheScope, CheckpointRef, ModelSpec, TenantShare};

/// The checkpoint chosen for a request and why (what the response headers say).
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSummary {
    /// Model name.
    pub model: Arc<str>,
    /// Version.
    pub version: Arc<str>,
    /// Why this checkpoint (also the `reason` metric label).
    pub reason: RouteReason,
    /// One line saying why, for `x-switchyard-route`.
    pub explanation: String,
    /// Estimated cost of the request on this checkpoint.
    pub estimated_cost: f64,
    /// The tenant charged, if any.
    pub tenant: Option<Arc<str>>,
    /// Whose cached prompt blocks the request reads (see [`CacheScope`]).
    pub cache_scope: CacheScope,
    /// The split and arm that chose it, if any.
    pub split_arm: Option<(Arc<str>, Arc<str>)>,
    /// What the policy's cascade made of the answer (`x-switchyard-cascade`), if the
    /// request went through one.
    pub cascade: Option<String>,
    /// A cascade's handoff (`x-switchyard-handoff`): which checkpoint's tokens were kept,
    /// how many, and which continued them.
    pub handoff: Option<String>,
    /// The engine's confidence in the answer (whole-JSON answers), for the quality
    /// signals recorded with it.
    pub confidence: Option<switchyard_seam::TokenConfidence>,
}

impl RouteSummary {
    /// The summary of `route`, taking its explanation (the route keeps only what
    /// settling needs).
    pub(super) fn of(route: &mut Route) -> Self {
        RouteSummary {
            model: Arc::clone(&route.model),
            version: Arc::clone(&route.version),
            reason: route.reason,
            explanation: std::mem::take(&mut route.explanation),
            estimated_cost: route.estimated_cost,
            tenant: route.tenant.clone(),
            cache_scope: route.cache_scope.clone(),
            split_arm: route.split.clone().zip(route.arm.clone()),
            cascade: None,
            handoff: None,
            confidence: None,
        }
    }

    /// The checkpoint the backend is asked for.
    pub fn checkpoint(&self) -> CheckpointRef {
        CheckpointRef::new(&*self.model, &*self.version)
    }
}

/// A request the policy layer let through. Cheap to clone; clones share the decision.
#[derive(Clone)]
pub struct RoutedRequest(Decision);

#[derive(Clone)]
enum Decision {
    /// The policy's choice, shared by the layer, the handler and the response stream.
    Routed(Arc<Ticket>),
    /// No policy: the request's `model` as sent, pinned to the version the backend
    /// picked at the first submit.
    Passthrough(Arc<OnceLock<CheckpointRef>>),
}

impl std::fmt::Debug for RoutedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedRequest")
            .field("route", &self.summary())
            .finish()
    }
}

/// One request's routing decision, shared by the layer (for response headers), the
/// handler and the response stream.
pub(crate) struct Ticket {
    pub(super) routing: Arc<PolicyRouting>,
    pub(super) request: RouteRequest,
    /// The `x-request-id`, for the usage record of whichever route settles.
    pub(super) request_id: String,
    started: Instant,
    state: Mutex<TicketState>,
}

pub(super) struct TicketState {
    /// `None` once settled.
    pub(super) route: Option<Route>,
    pub(super) summary: RouteSummary,
    /// Checkpoints already given up on (fallbacks never go back to one).
    tried: Vec<(Arc<str>, Arc<str>)>,
    /// The largest prompt as the engine counted it, once [`RoutedRequest::cover`] ran.
    prompt_tokens: Option<u32>,
    /// The cascade's verdict on this step stands although it asked to defer (the next
    /// model could not take the request): the step answers again without the unsure
    /// stop, and is not judged again.
    pub(super) cascade_settled: bool,
}

/// How a failure reflects on the checkpoint that had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The checkpoint could not serve what the policy routed to it (unknown to the
    /// engine, smaller context than the policy says, engine failure): counts as an error
    /// for the split's rollback rule and may trigger `failing` fallbacks.
    Failing,
    /// The checkpoint is busy: triggers `overloaded` fallbacks, not counted as an error.
    Overloaded,
    /// The request itself was at fault (a parameter only the engine could check).
    Request,
}

fn blame(error: &BackendError) -> Blame {
    match error {
        BackendError::UnknownModel { .. }
        | BackendError::ContextOverflow { .. }
        | BackendError::Internal { .. } => Blame::Failing,
        // Busy here for now (an adapter loading): another checkpoint may serve it.
        BackendError::Overloaded | BackendError::Unavailable { .. } => Blame::Overloaded,
        // The tenant's own load: another checkpoint of the same engine would not help.
        BackendError::InvalidRequest { .. } | BackendError::TenantBusy { .. } => Blame::Request,
    }
}

impl RoutedRequest {
    /// No policy: the backend is asked for the request's `model` as sent.
    pub fn passthrough() -> Self {
        RoutedRequest(Decision::Passthrough(Arc::default()))
    }

    /// Pins a pass-through request to `model` (the checkpoint the backend
    /// resolved its name to); later calls keep the first pin. Routed requests ignore it.
    pub fn pin(&self, model: CheckpointRef) {
        if let Decision::Passthrough(pinned) = &self.0 {
            let _ = pinned.set(model);
        }
    }

    pub(crate) fn routed(
        routing: Arc<PolicyRouting>,
        request: RouteRequest,
        request_id: &str,
        mut route: Route,
    ) -> Self {
        label(&mut route, &request, request_id);
        let summary = RouteSummary::of(&mut route);
        RoutedRequest(Decision::Routed(Arc::new(Ticket {
            routing,
            request,
            request_id: request_id.to_owned(),
            started: Instant::now(),
            state: Mutex::new(TicketState {
                route: Some(route),
                summary,
                tried: Vec::new(),
                prompt_tokens: None,
                cascade_settled: false,
            }),
        })))
    }

    /// Holds the budget for the prompts as the engine counted them, one count per
    /// generation (see [`Route::cover`]); a refusal (429, or 503 when the ledger is
    /// down) comes before anything runs. A pass-through request holds nothing.
    pub fn cover(&self, prompt_tokens: &[u32]) -> Result<(), PolicyRejection> {
        let Some(ticket) = self.ticket() else {
            return Ok(());
        };
        let mut state = ticket.lock();
        state.prompt_tokens = prompt_tokens.iter().copied().max();
        match state.route.as_mut() {
            Some(route) => route
                .cover(prompt_tokens)
                .map(drop)
                .map_err(PolicyRejection::Route),
            None => Ok(()),
        }
    }

    /// The request was refused before it ran: gives its reservation back, recording
    /// no spend and no usage.
    pub fn release(&self) {
        let Some(ticket) = self.ticket() else { return };
        let route = ticket.lock().route.take();
        if let Some(route) = route {
            route.reservation.release();
        }
    }

    /// Whether a policy routed this request (false: pass-through).
    pub fn is_routed(&self) -> bool {
        self.ticket().is_some()
    }

    pub(super) fn ticket(&self) -> Option<&Arc<Ticket>> {
        match &self.0 {
            Decision::Routed(ticket) => Some(ticket),
            Decision::Passthrough(_) => None,
        }
    }

    /// The current routing decision; `None` for a pass-through request.
    pub fn summary(&self) -> Option<RouteSummary> {
        self.with_summary(RouteSummary::clone)
    }

    /// Reads the current routing decision in place (no copy); `None` for a pass-through
    /// request. `read` runs under the decision's lock: keep it short.
    pub fn with_summary<R>(&self, read: impl FnOnce(&RouteSummary) -> R) -> Option<R> {
        self.ticket().map(|t| read(&t.lock().summary))
    }

    /// The model to ask the backend for: the routed checkpoint, or for a pass-through
    /// request the checkpoint it was pinned to, else `requested` (the body's `model`).
    pub fn backend_model(&self, requested: &ModelSpec) -> ModelSpec {
        match &self.0 {
            Decision::Routed(ticket) => ticket.lock().summary.checkpoint().into(),
            Decision::Passthrough(pinned) => pinned
                .get()
                .map_or_else(|| requested.clone(), |pin| pin.clone().into()),
        }
    }

    /// Whose cached prompt blocks the request reads: its tenant's scope as the
    /// policy sets it; the deployment's one scope for a pass-through request.
    pub fn cache_scope(&self) -> CacheScope {
        self.with_summary(|summary| summary.cache_scope.clone())
            .unwrap_or_else(CacheScope::deployment)
    }

    /// The tenant the request runs for, its weight and its part of the engine's KV
    /// budget and queue in the current policy, for the engine's fair admission and
    /// caps; no tenant for a pass-through or anonymous request.
    pub fn tenant_share(&self) -> TenantShare {
        let Some(ticket) = self.ticket() else {
            return TenantShare::default();
        };
        let tenant = ticket.lock().summary.tenant.clone();
        let policy = ticket.routing.store().current();
        let kv_permille = policy.kv_permille(tenant.as_deref());
        let Some(name) = tenant else {
            return TenantShare::default().with_kv_permille(kv_permille);
        };
        let weight = policy.tenant(&name).map_or(1, |t| t.weight);
        TenantShare::new(name, weight).with_kv_permille(kv_permille)
    }

    /// The largest prompt's tokens: as the engine counted them once known, else as
    /// estimated for routing (0 for pass-through).
    pub fn estimated_prompt_tokens(&self) -> u32 {
        self.ticket().map_or(0, |t| {
            t.lock().prompt_tokens.unwrap_or(t.request.prompt_tokens)
        })
    }

    /// The request finished: settles the budget with `usage` and records a success.
    pub fn succeeded(&self, usage: Usage) {
        self.settle(usage, Some(true));
    }

    /// The request failed with `error` after routing; settles with what was generated
    /// (`usage`) and, when the checkpoint is to blame, records an error for its split.
    pub fn failed(&self, error: &BackendError, usage: Usage) {
        let outcome = (blame(error) == Blame::Failing).then_some(false);
        self.settle(usage, outcome);
    }

    /// The client went away (or the request was abandoned): settles what was generated,
    /// without counting it for or against the checkpoint.
    pub fn cancelled(&self, usage: Usage) {
        self.settle(usage, None);
    }

    fn settle(&self, usage: Usage, outcome: Option<bool>) {
        let Some(ticket) = self.ticket() else { return };
        let (route, confidence) = {
            let mut state = ticket.lock();
            (state.route.take(), state.summary.confidence)
        };
        let Some(route) = route else {
            return;
        };
        let latency_ms = ticket.started.elapsed().as_secs_f64() * 1000.0;
        match outcome {
            Some(succeeded) => {
                // The answer's confidence is a quality signal for the split's rule.
                if let (true, Some(confidence)) = (succeeded, confidence) {
                    route.record_confidence(f64::from(confidence.mean));
                }
                route.finish(Completion {
                    usage,
                    succeeded,
                    latency_ms,
                });
            }
            None => {
                route.reservation.settle(usage);
            }
        }
    }

    /// After the backend refused or failed the request with `error` before anything was
    /// sent to the client: if the policy has a fallback for this (the requested model's
    /// `[[fallbacks]]`, `on = overloaded` or `failing`), routes to the first alternative
    /// that qualifies and returns true; the caller then retries with
    /// [`RoutedRequest::backend_model`]. The failed attempt is settled either way
    /// (false: the caller reports the error as usual).
    pub fn fall_back(&self, error: &BackendError) -> bool {
        let Some(ticket) = self.ticket() else {
            return false;
        };
        let blame = blame(error);
        if blame == Blame::Request {
            return false;
        }
        let Some(next) = ticket.next_fallback(blame) else {
            return false;
        };
        let mut state = ticket.lock();
        let failed = state.route.take();
        let from = state.summary.checkpoint().to_string();
        let tried = (state.summary.model.clone(), state.summary.version.clone());
        state.tried.push(tried);
        let mut next = next;
        state.summary = RouteSummary::of(&mut next);
        state.route = Some(next);
        drop(state);
        if let Some(failed) = failed {
            let latency_ms = ticket.started.elapsed().as_secs_f64() * 1000.0;
            if blame == Blame::Failing {
                failed.record_outcome(false, latency_ms);
            }
            failed.reservation.release();
        }
        let to = self
            .with_summary(|s| s.checkpoint().to_string())
            .unwrap_or_default();
        let trigger = if blame == Blame::Overloaded {
            "overloaded"
        } else {
            "failing"
        };
        tracing::info!(%from, %to, trigger, %error, "falling back");
        ::metrics::counter!(crate::policy::FALLBACKS_TOTAL,
            "from" => from, "to" => to, "trigger" => trigger)
        .increment(1);
        true
    }
}

impl Ticket {
    pub(super) fn lock(&self) -> MutexGuard<'_, TicketState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Routes to the first fallback alternative of the requested model that the policy
    /// accepts for this request and that was not tried yet.
    fn next_fallback(&self, blame: Blame) -> Option<Route> {
        let policy = self.routing.store().current();
        let (failed_model, tried) = {
            let state = self.lock();
            let mut tried = state.tried.clone();
            tried.push((state.summary.model.clone(), state.summary.version.clone()));
            (state.summary.model.clone(), tried)
        };
        // The fallback list belongs to the model the client asked for (a split arm may
        // be another model); under `auto`, to the model that was picked.
        let requested = match &self.request.model {
            ModelHint::Named { name } | ModelHint::Pinned { name, .. } => name.as_str(),
            ModelHint::Auto => &failed_model,
        };
        let model = policy.models().get(policy.model_index(requested)?)?;
        let fallback = model.fallback.as_ref()?;
        let applies = match blame {
            Blame::Overloaded => fallback.on.overloaded,
            Blame::Failing => fallback.on.failing,
            Blame::Request => false,
        };
        if !applies {
            return None;
        }
        for (rank, target) in fallback.alternatives.iter().enumerate() {
            let Some(alt) = policy.models().get(target.model) else {
                continue;
            };
            let hint = match target.version.and_then(|v| alt.versions.get(v)) {
                Some(version) => ModelHint::Pinned {
                    name: alt.name.to_string(),
                    version: version.to_string(),
                },
                None => ModelHint::Named {
                    name: alt.name.to_string(),
                },
            };
            let mut request = self.request.clone();
            request.model = hint;
            let Ok(mut route) = self.routing.route(&request) else {
                continue;
            };
            label(&mut route, &self.request, &self.request_id);
            if tried
                .iter()
                .any(|(m, v)| *m == route.model && *v == route.version)
            {
                continue;
            }
            route.reason = RouteReason::Fallback;
            route.explanation = format!(
                "fallback #{} for `{requested}` ({} was {})",
                rank + 1,
                tried
                    .last()
                    .map_or_else(String::new, |(m, v)| format!("{m}@{v}")),
                match blame {
                    Blame::Overloaded => "overloaded",
                    _ => "failing",
                }
            );
            return Some(route);
        }
        None
    }
}

/// Names the request in the usage record its route settles: the request id and the
/// API key it came with (the ledger keeps only a hash of it).
pub(super) fn label(route: &mut Route, request: &RouteRequest, request_id: &str) {
    let key = match &request.caller {
        switchyard_policies::Caller::ApiKey(key) => Some(key.as_str()),
        _ => None,
    };
    route.reservation.label(request_id, key);
}

impl<S: Send + Sync> FromRequestParts<S> for RoutedRequest {
    type Rejection = PolicyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RoutedRequest>()
            .cloned()
            .ok_or(PolicyRejection::NotRouted)
    }
}
