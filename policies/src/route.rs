//! Routing one request: authenticate, gather candidates, score, pick, reserve budget.
//!
//! Candidates come from the `model` hint: every model for `auto`; the named model (its
//! split arm or active version) for a name or alias; exactly one checkpoint for
//! `name@version`. Under `auto` the best utility wins (see [`crate::score`]); a named or
//! pinned model that is overloaded, failing or over budget gives way to its fallback
//! list, tried in order. The budget is reserved for the pick before returning, and a
//! reservation that loses a race to a concurrent request counts as over budget.

use std::sync::Arc;

use switchyard_seam::CacheScope;

use crate::authenticate::caller_tenant;
use crate::constraint::ConstraintFailure;
use crate::context::Context;
use crate::decimal::{push_digits, push_fixed};
use crate::engine_view::EngineView;
use crate::live::budget::{now_secs, Billing, Refusal, Reservation};
use crate::live::rollback::RollbackMonitor;
use crate::metrics::{self, RouteKey, RoutedLabels};
use crate::plan::Plan;
use crate::policy::Policy;
use crate::request::RouteRequest;
use crate::route_error::RouteError;
use crate::route_reason::RouteReason;
use crate::score::{pick_order, Detail, Scored, Via};
use crate::spend::{Spend, Usage};

/// The routing decision for one request, holding its budget reservation.
///
/// When the request ends, call [`Route::finish`] (or settle [`Route::reservation`] and
/// call [`Route::record_outcome`] yourself). Dropping a route releases its reservation.
#[derive(Debug)]
pub struct Route {
    /// Chosen model.
    pub model: Arc<str>,
    /// Chosen version.
    pub version: Arc<str>,
    /// The split that chose the arm, if any.
    pub split: Option<Arc<str>>,
    /// The arm, if a split chose it.
    pub arm: Option<Arc<str>>,
    /// Why this checkpoint.
    pub reason: RouteReason,
    /// One line saying why, for the `x-switchyard-route` header.
    pub explanation: String,
    /// Estimated cost of the request on this checkpoint.
    pub estimated_cost: f64,
    /// Estimated prompt plus output tokens.
    pub estimated_tokens: u64,
    /// The tenant charged, if any.
    pub tenant: Option<Arc<str>>,
    /// Whose cached prompt blocks the request reads: its tenant's scope, or
    /// the deployment's for a caller without one.
    pub cache_scope: CacheScope,
    /// Budget held for this request.
    pub reservation: Reservation,
    rollback: Option<(Arc<RollbackMonitor>, usize)>,
    key: RouteKey,
    /// What [`Route::cover`] needs to work out the worst case again.
    bounds: WorstCaseBounds,
}

/// The numbers a request's worst case is worked out from, besides its prompts.
#[derive(Debug, Clone, Copy)]
struct WorstCaseBounds {
    context_limit: u64,
    max_output_tokens: Option<u64>,
    price: crate::spend::Price,
}

/// How a routed request ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    /// Actual token counts.
    pub usage: Usage,
    /// False when the engine failed the request.
    pub succeeded: bool,
    /// Time from routing to the last token, in milliseconds.
    pub latency_ms: f64,
}

impl Route {
    /// Settles the budget with the actual usage and feeds the split's rollback rule.
    pub fn finish(self, completion: Completion) -> Spend {
        self.record_outcome(completion.succeeded, completion.latency_ms);
        self.reservation.settle(completion.usage)
    }

    /// Holds the worst case of the prompts as the engine counted them (templated and
    /// tokenized, one count per generation, so `n` choices of a prompt repeat its count)
    /// instead of the routing estimate: each generation's prompt plus its `max_tokens`,
    /// or the rest of the context window when it sets none. All or nothing: when the
    /// budget cannot hold it the reservation stays as it was and the request is refused
    /// (429) before it runs.
    pub fn cover(&mut self, prompt_tokens: &[u32]) -> Result<Spend, RouteError> {
        let b = self.bounds;
        let (mut prompts, mut outputs) = (0u64, 0u64);
        for &p in prompt_tokens {
            let prompt = u64::from(p).min(b.context_limit);
            let room = b.context_limit - prompt;
            prompts = prompts.saturating_add(prompt);
            outputs = outputs.saturating_add(b.max_output_tokens.map_or(room, |m| m.min(room)));
        }
        let worst = b.price.spend(prompts, outputs);
        match self.reservation.resize(worst) {
            Ok(()) => {
                self.estimated_tokens = worst.tokens;
                Ok(worst)
            }
            Err(refusal) => {
                let error = refusal_error(refusal, &self.model, &self.version);
                // Counted as routing's refusals are: the same constraint, the same kind.
                metrics::rejected(&error);
                Err(error)
            }
        }
    }

    /// Feeds the split's rollback rule (no-op when no rule watches this arm).
    pub fn record_outcome(&self, succeeded: bool, latency_ms: f64) {
        if let Some((monitor, arm)) = &self.rollback {
            monitor.record(*arm, succeeded, latency_ms);
        }
    }

    /// Feeds the split's rollback rule the answer's mean token log-probability (no-op
    /// when no rule watches this arm).
    pub fn record_confidence(&self, mean_logprob: f64) {
        if let Some((monitor, arm)) = &self.rollback {
            monitor.record_confidence(*arm, mean_logprob);
        }
    }

    fn metric_labels(&self) -> RoutedLabels<'_> {
        RoutedLabels {
            model: &self.model,
            version: &self.version,
            split: self.split.as_ref(),
            arm: self.arm.as_ref(),
            reason: self.reason,
        }
    }
}

/// Routes `req` under `policy` given live engine state.
pub fn route(
    policy: &Policy,
    req: &RouteRequest,
    engine: &dyn EngineView,
) -> Result<Route, RouteError> {
    let result = route_inner(policy, req, engine);
    match &result {
        Ok(r) => metrics::routed(&policy.live.route_counters, r.key, &r.metric_labels()),
        Err(e) => metrics::rejected(e),
    }
    result
}

fn route_inner(
    policy: &Policy,
    req: &RouteRequest,
    engine: &dyn EngineView,
) -> Result<Route, RouteError> {
    let tenant = caller_tenant(policy, &req.caller)?;
    let ctx = Context::new(policy, tenant, req);
    let plan = Plan::new(policy, req, tenant)?;
    let now = now_secs();
    // Set when the ledger could not be asked: the request then fails as a whole (503),
    // not as one candidate over budget.
    let mut ledger_down: Option<String> = None;
    let mut reserve = |s: &Scored| {
        let budgets = tenant.map_or(&[][..], |t| &t.live.budgets[..]);
        Reservation::reserve(
            tenant.map(|t| Arc::clone(&t.live.meter)),
            &policy.live.ledger,
            budgets,
            ctx.worst_case_of(s.model),
            ctx.price(s.model),
            now,
        )
        .map_err(|refusal| match refusal {
            Refusal::Short(short) => ConstraintFailure::OverBudget {
                budget: short.window,
                needed: short.needed,
                remaining: short.remaining,
            },
            Refusal::Unavailable(reason) => {
                let failure = ConstraintFailure::OverBudget {
                    budget: Arc::from("ledger"),
                    needed: 0.0,
                    remaining: 0.0,
                };
                ledger_down = Some(reason);
                failure
            }
        })
    };
    let mut scored = if plan.ranked() {
        // Under `auto`, first the best candidate alone: when its budget holds, as it
        // nearly always does, no other score is kept. Otherwise the full list, below.
        match plan.best_primary(&ctx, engine) {
            (Some(best), qualifying) => {
                if let Ok(reservation) = reserve(&best) {
                    let best = std::slice::from_ref(&best);
                    if let Some(route) = build(&ctx, &plan, best, 0, qualifying, reservation) {
                        return Ok(route);
                    }
                }
                plan.score_primary(&ctx, engine, Detail::Verdict)
            }
            // Nothing qualifies: straight to the detailed scores for the error.
            (None, _) => Vec::new(),
        }
    } else {
        plan.score_primary(&ctx, engine, Detail::Verdict)
    };
    if let Some((i, reservation)) = select(policy, &mut scored, plan.ranked(), &mut reserve) {
        let qualifying = scored.iter().filter(|s| s.qualifies()).count();
        if let Some(route) = build(&ctx, &plan, &scored, i, qualifying, reservation) {
            return Ok(route);
        }
    }
    if let Some(mut fallbacks) = plan.score_fallbacks(&ctx, &scored, engine) {
        if let Some((i, reservation)) = select(policy, &mut fallbacks, false, &mut reserve) {
            let qualifying = fallbacks.iter().filter(|s| s.qualifies()).count();
            if let Some(route) = build(&ctx, &plan, &fallbacks, i, qualifying, reservation) {
                return Ok(route);
            }
        }
        scored.extend(fallbacks);
    }
    if let Some(reason) = ledger_down {
        return Err(RouteError::LedgerUnavailable { reason });
    }
    if plan.ranked() {
        // The fast pass kept verdicts only; score again to say what failed where. Races
        // lost while reserving show up as budget failures in the fresh scores too.
        scored = plan.score_primary(&Context::new(policy, tenant, req), engine, Detail::All);
    }
    Err(RouteError::NoCandidate {
        hint: plan.hint_text(),
        rejections: scored.iter().map(|s| s.rejection(policy)).collect(),
    })
}

/// Tries qualifying candidates (best utility first when `ranked`, else in order) until
/// `take` accepts one; a refusal is recorded as a failure of that candidate.
pub(crate) fn select<T>(
    policy: &Policy,
    scored: &mut [Scored],
    ranked: bool,
    take: &mut dyn FnMut(&Scored) -> Result<T, ConstraintFailure>,
) -> Option<(usize, T)> {
    loop {
        let next = if ranked {
            let mut best: Option<usize> = None;
            for (i, s) in scored.iter().enumerate().filter(|(_, s)| s.qualifies()) {
                if best.is_none_or(|b| {
                    scored
                        .get(b)
                        .is_some_and(|b| pick_order(policy, s, b).is_lt())
                }) {
                    best = Some(i);
                }
            }
            best
        } else {
            scored.iter().position(Scored::qualifies)
        }?;
        let candidate = scored.get_mut(next)?;
        match take(candidate) {
            Ok(t) => return Some((next, t)),
            Err(failure) => candidate.failures.push(failure),
        }
    }
}

pub(crate) fn build(
    ctx: &Context,
    plan: &Plan,
    scored: &[Scored],
    i: usize,
    qualifying: usize,
    mut reservation: Reservation,
) -> Option<Route> {
    let policy = ctx.policy;
    let s = scored.get(i)?;
    let m = policy.compiled.models.get(s.model)?;
    let version = Arc::clone(m.versions.get(s.version)?);
    reservation.set_billing(Billing {
        tenant: ctx.tenant.map(|t| Arc::clone(&t.compiled.name)),
        model: Arc::clone(&m.name),
        version: Arc::clone(&version),
    });
    let (split, arm, rollback, reason, explanation) = match s.via {
        Via::Split { split, arm } => {
            let sp = policy.compiled.splits.get(split)?;
            let a = sp.arms.get(arm)?;
            let (reason, why) = if policy.live.is_rolled_back(split) {
                (
                    RouteReason::RolledBack,
                    format!("split `{}` rolled back to arm `{}`", sp.name, a.name),
                )
            } else {
                (
                    RouteReason::Split,
                    format!("split `{}` arm `{}` ({}%)", sp.name, a.name, a.weight),
                )
            };
            let monitor = policy
                .live
                .rollback(split)
                .map(|mon| (Arc::clone(mon), arm));
            (
                Some(sp.name.clone()),
                Some(a.name.clone()),
                monitor,
                reason,
                why,
            )
        }
        Via::Fallback { rank } => {
            let requested = plan
                .requested
                .and_then(|r| policy.compiled.models.get(r))
                .map_or("?", |r| &*r.name);
            (
                None,
                None,
                None,
                RouteReason::Fallback,
                format!("fallback #{} for `{requested}`", rank + 1),
            )
        }
        Via::Direct => {
            let why = match plan.reason() {
                RouteReason::Auto => auto_explanation(s, qualifying),
                RouteReason::Alias => format!("alias `{}` of `{}`", plan.hint_text(), m.name),
                RouteReason::Pinned => "pinned version".to_string(),
                _ => "named model".to_string(),
            };
            (None, None, None, plan.reason(), why)
        }
    };
    Some(Route {
        model: Arc::clone(&m.name),
        version,
        split,
        arm,
        reason,
        explanation,
        estimated_cost: s.estimate.cost,
        estimated_tokens: s.estimate.tokens,
        tenant: ctx.tenant.map(|t| Arc::clone(&t.compiled.name)),
        cache_scope: ctx
            .tenant
            .map_or_else(CacheScope::deployment, |t| t.compiled.cache_scope.clone()),
        reservation,
        rollback,
        key: RouteKey {
            checkpoint: policy
                .compiled
                .checkpoint_slot(s.model, s.version)
                .unwrap_or(usize::MAX),
            split_arm: match s.via {
                Via::Split { split, arm } => Some((split, arm)),
                _ => None,
            },
        },
        bounds: WorstCaseBounds {
            context_limit: u64::from(m.context_limit),
            max_output_tokens: ctx.max_output_tokens,
            price: m.price(),
        },
    })
}

/// The error of a reservation that [`Route::cover`] could not grow.
fn refusal_error(refusal: Refusal, model: &str, version: &str) -> RouteError {
    match refusal {
        Refusal::Short(short) => RouteError::NoCandidate {
            hint: format!("{model}@{version}"),
            rejections: vec![crate::route_error::Rejection {
                model: model.to_owned(),
                version: version.to_owned(),
                failures: vec![ConstraintFailure::OverBudget {
                    budget: short.window,
                    needed: short.needed,
                    remaining: short.remaining,
                }],
            }],
        },
        Refusal::Unavailable(reason) => RouteError::LedgerUnavailable { reason },
    }
}

/// `auto: best utility 0.8123 of 7 qualifying (quality 0.850, cost 0.000420, latency 35 ms)`.
fn auto_explanation(s: &Scored, qualifying: usize) -> String {
    let mut why = String::with_capacity(96);
    why.push_str("auto: best utility ");
    push_fixed(&mut why, s.utility, 4);
    why.push_str(" of ");
    push_digits(&mut why, qualifying as u64, 1);
    why.push_str(" qualifying (quality ");
    push_fixed(&mut why, s.quality, 3);
    why.push_str(", cost ");
    push_fixed(&mut why, s.estimate.cost, 6);
    why.push_str(", latency ");
    push_fixed(&mut why, s.expected_latency_ms, 0);
    why.push_str(" ms)");
    why
}
