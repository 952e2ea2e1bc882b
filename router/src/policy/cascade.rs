//! Cascades (`[cascade]` in the policy): an `auto` request is answered by the cascade's
//! first model; when the engine's confidence in that answer (a quantile of its token
//! log-probabilities, measured in the engine) is below the threshold, the answer is
//! dropped and the next model answers instead.
//!
//! A streamed request waits for the verdict: a step before the last runs to its end
//! unseen, and the stream (headers included, so `x-switchyard-cascade` is known) starts
//! once it is judged: the accepted answer's tokens are sent as they were generated, or
//! the next model's as they come (`judged_stream` in `openai/tail/stream.rs`).
//! The deferred attempt is billed like any answer (its tokens were computed); the
//! response's `usage` is the answer the client gets.

use switchyard_policies::{ModelHint, RouteRequest};
use switchyard_seam::{TokenConfidence, Usage};

use crate::policy::routed::{label, RouteSummary, RoutedRequest};
use crate::policy::routing::PolicyRouting;

/// Counter: cascade verdicts by `model` (the checkpoint judged) and `outcome`
/// (`accepted`, `deferred`).
pub const CASCADE_TOTAL: &str = "switchyard_cascade_total";

/// When the current policy has a cascade and `request` is `auto`: the request as its
/// first step routes it (the cascade's first model, named).
pub(crate) fn first_step(routing: &PolicyRouting, request: &RouteRequest) -> Option<RouteRequest> {
    if request.model != ModelHint::Auto {
        return None;
    }
    let policy = routing.store().current();
    let first = policy.cascade()?.models.first().copied()?;
    let model = policy.models().get(first)?;
    let mut step = request.clone();
    step.model = ModelHint::Named {
        name: model.name.to_string(),
    };
    Some(step)
}

impl RoutedRequest {
    /// Marks a request routed by [`first_step`]: its explanation.
    pub(crate) fn start_cascade(&self) {
        let Some(ticket) = self.ticket() else { return };
        let mut state = ticket.lock();
        let summary = &mut state.summary;
        summary.explanation = format!(
            "cascade step 1 (auto with [cascade]): {}",
            summary.explanation
        );
    }

    /// Whether the answer this request is routed to now will be judged: an `auto`
    /// request on a cascade step before the last.
    pub fn judged_in_cascade(&self) -> bool {
        let Some(ticket) = self.ticket() else {
            return false;
        };
        if ticket.request.model != ModelHint::Auto {
            return false;
        }
        let policy = ticket.routing.store().current();
        let Some(cascade) = policy.cascade() else {
            return false;
        };
        let model = ticket.lock().summary.model.clone();
        policy
            .model_index(&model)
            .and_then(|current| cascade.next_after(current))
            .is_some()
    }

    /// Judges a finished whole-JSON answer (`confidence`: the least confident choice's)
    /// when the request is a cascade step before the last. Deferred: settles this
    /// attempt with `usage`, routes to the next model and returns true (the caller
    /// submits again). Accepted, or not a cascade: returns false and settles nothing.
    pub fn defer_in_cascade(&self, confidence: Option<TokenConfidence>, usage: Usage) -> bool {
        let Some(ticket) = self.ticket() else {
            return false;
        };
        if ticket.request.model != ModelHint::Auto {
            return false;
        }
        let policy = ticket.routing.store().current();
        let Some(cascade) = policy.cascade() else {
            return false;
        };
        let (model, from) = {
            let state = ticket.lock();
            (
                state.summary.model.clone(),
                state.summary.checkpoint().to_string(),
            )
        };
        let Some(current) = policy.model_index(&model) else {
            return false;
        };
        let Some(next) = cascade.next_after(current) else {
            return false;
        };
        let verdict = cascade.judge(confidence.as_ref());
        if !verdict.defer {
            let mut state = ticket.lock();
            state.summary.cascade = Some(format!("accepted: {}", verdict.reason));
            count(&state.summary, "accepted");
            return false;
        }
        let Some(next_model) = policy.models().get(next) else {
            return false;
        };
        let mut request = ticket.request.clone();
        request.model = ModelHint::Named {
            name: next_model.name.to_string(),
        };
        let Ok(mut route) = ticket.routing.route(&request) else {
            // The stronger model cannot take it (budget, permission): the answer stands.
            let mut state = ticket.lock();
            state.summary.cascade = Some(format!(
                "accepted: {}; `{}` cannot take the request",
                verdict.reason, next_model.name
            ));
            count(&state.summary, "accepted");
            return false;
        };
        label(&mut route, &ticket.request, &ticket.request_id);
        {
            let state = ticket.lock();
            count(&state.summary, "deferred");
        }
        self.succeeded(usage);
        let mut state = ticket.lock();
        route.explanation = format!(
            "cascade: {from} deferred ({}); {}",
            verdict.reason, route.explanation
        );
        state.summary = RouteSummary::of(&mut route);
        state.summary.cascade = Some(format!("deferred from {from}: {}", verdict.reason));
        state.route = Some(route);
        tracing::info!(%from, to = %state.summary.checkpoint().to_string(), reason = %verdict.reason, "cascade deferred");
        true
    }
}

fn count(summary: &RouteSummary, outcome: &'static str) {
    ::metrics::counter!(CASCADE_TOTAL, "model" => summary.checkpoint().to_string(), "outcome" => outcome)
        .increment(1);
}
