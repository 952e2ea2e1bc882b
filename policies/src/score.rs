//! The routing objective, one candidate at a time: its constraints and its utility.
//!
//! A candidate qualifies when it breaks no constraint. Among those that qualify the
//! policy picks the highest [`utility`]
//!
//! ```text
//! utility = quality_weight × Q − cost_weight × C − latency_weight × L
//! ```
//!
//! where `Q` is the model's quality for the request's tags (the weakest tag, or overall),
//! `C` the estimated cost of this request (prompt tokens at the input price plus
//! `max_tokens`, or `routing.assumed_output_tokens`, at the output price) and `L` the
//! expected latency in milliseconds from live engine state (swap or load when not
//! resident + queue wait + output tokens × ms per token). Equal utilities are broken by
//! model name, then version name, both ascending, so the pick is deterministic.
//!
//! Under `auto` the same objective runs in a columnar form: [`crate::scan`] decides the
//! constraints that need only the policy and the request for a block of models at once,
//! then [`live_utility`] finishes each survivor. Its tests hold the forms equal: check by
//! check (`fast_verdict_matches_score`, `static_pass_matches_the_fast_verdict`) and pick
//! by pick (`columnar_pick_matches_the_plain_pick`).

use std::cmp::Ordering;

use crate::compiled::model::Model;
use crate::constraint::{ConstraintFailure, LatencyLimit};
use crate::context::Context;
use crate::engine_view::{CheckpointKey, EngineView};
use crate::policy::Policy;
use crate::route_error::Rejection;
use crate::spend::Spend;

/// The utility of a candidate of `quality` whose request is estimated to cost `cost`
/// and to take `expected_latency_ms`, under the policy's `[routing]` weights.
pub(crate) fn utility(ctx: &Context, quality: f64, cost: f64, expected_latency_ms: f64) -> f64 {
    let r = &ctx.policy.compiled.routing;
    r.quality_weight * quality
        - weighted(r.cost_weight, cost)
        - weighted(r.latency_weight, expected_latency_ms)
}

/// `weight × value`, where a zero weight ignores the value even when it is infinite.
fn weighted(weight: f64, value: f64) -> f64 {
    if weight == 0.0 {
        0.0
    } else {
        weight * value
    }
}

/// How a candidate entered the candidate set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// The model itself (named, aliased, pinned or under `auto`).
    Direct,
    /// An arm of a split on the requested model.
    Split { split: usize, arm: usize },
    /// A fallback alternative (0-based rank in the list) of the requested model.
    Fallback { rank: usize },
}

/// A candidate with its numbers and the constraints it breaks (empty: it qualifies).
#[derive(Debug, Clone)]
pub(crate) struct Scored {
    pub model: usize,
    pub version: usize,
    pub via: Via,
    pub queue_depth: u32,
    pub quality: f64,
    /// Index into the request's tags of the tag that set `quality`.
    pub quality_tag: Option<usize>,
    pub estimate: Spend,
    pub expected_latency_ms: f64,
    pub utility: f64,
    /// Broken constraints (under [`Detail::Verdict`] only qualifying candidates are scored).
    pub failures: Vec<ConstraintFailure>,
}

impl Scored {
    pub fn qualifies(&self) -> bool {
        self.failures.is_empty()
    }

    /// This candidate as a routing error lists it.
    pub fn rejection(&self, policy: &Policy) -> Rejection {
        let m = policy.compiled.models.get(self.model);
        Rejection {
            model: m.map_or_else(String::new, |m| m.name.to_string()),
            version: m
                .and_then(|m| m.versions.get(self.version))
                .map_or_else(String::new, |v| v.to_string()),
            failures: self.failures.clone(),
        }
    }
}

/// How much to record about broken constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// Every broken constraint, for errors, fallback triggers and explain.
    All,
    /// Stop at the first broken constraint and record nothing: the fast path for `auto`,
    /// which re-scores with `All` only if it has to report an error.
    Verdict,
}

/// Measures checkpoint `model`/`version` against every constraint and computes its utility.
///
/// The constraints that need only the policy and the request come first, in the order
/// [`ConstraintFailure`]s are reported; those on live engine state (health, queue,
/// latency) last. Under [`Detail::Verdict`] the first broken constraint ends it with
/// `None`, so a candidate the policy or the request rules out never costs an engine
/// query; `None` also means the indices name no checkpoint.
pub(crate) fn score(
    ctx: &Context,
    model: usize,
    version: usize,
    via: Via,
    engine: &dyn EngineView,
    detail: Detail,
) -> Option<Scored> {
    let m = ctx.policy.compiled.models.get(model)?;
    let key = ctx.policy.checkpoint_key(model, version)?;
    let verdict = detail == Detail::Verdict;
    // Every broken constraint, in report order (under Verdict the first one returns).
    let mut failures = Vec::new();

    if let Some(t) = ctx.tenant.map(|t| t.compiled) {
        if !t.may_use(model) {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::NotPermitted {
                tenant: t.name.clone(),
            });
        }
    }
    let (quality, quality_tag) = ctx.quality(model, m);
    if let Some(floor) = ctx.min_quality {
        if quality < floor {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::QualityBelowFloor {
                tag: quality_tag.and_then(|i| ctx.tags.get(i)).cloned(),
                quality,
                floor,
            });
        }
    }
    let estimate = ctx.estimate(m);
    if let Some(ceiling) = ctx.max_cost {
        if estimate.cost > ceiling {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::CostAboveCeiling {
                estimated: estimate.cost,
                ceiling,
            });
        }
    }
    if let Some(t) = ctx
        .tenant
        .map(|t| t.compiled)
        .filter(|t| !t.budgets.is_empty())
    {
        // The reservation holds the worst case; the estimate can exceed it only when the
        // assumed output runs past the context.
        let worst = ctx.worst_case(m);
        for (budget, &remaining) in t.budgets.iter().zip(&ctx.budget_remaining) {
            let needed = estimate
                .in_unit(budget.unit())
                .max(worst.in_unit(budget.unit()));
            if needed > remaining {
                if verdict {
                    return None;
                }
                failures.push(ConstraintFailure::OverBudget {
                    budget: budget.label().clone(),
                    needed,
                    remaining,
                });
            }
        }
    }
    if ctx.context_needed > u64::from(m.context_limit) {
        if verdict {
            return None;
        }
        failures.push(ConstraintFailure::ContextTooLong {
            needed: ctx.context_needed,
            limit: m.context_limit,
        });
    }

    let state = engine.state_at(&key);
    let expected_latency_ms = state.expected_latency_ms(ctx.output_tokens);
    if !state.healthy {
        if verdict {
            return None;
        }
        failures.push(ConstraintFailure::Unhealthy);
    }
    if let Some(max) = m.max_queue_depth {
        if state.queue_depth >= max {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::QueueFull {
                depth: state.queue_depth,
                max,
            });
        }
    }
    if let Some((limit_ms, set_by)) = latency_limit(ctx.max_latency_ms, m.latency_target_ms) {
        if expected_latency_ms > limit_ms {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::LatencyAboveTarget {
                expected_ms: expected_latency_ms,
                limit_ms,
                set_by,
            });
        }
    }
    let utility = utility(ctx, quality, estimate.cost, expected_latency_ms);
    Some(Scored {
        model,
        version,
        via,
        queue_depth: state.queue_depth,
        quality,
        quality_tag,
        estimate,
        expected_latency_ms,
        utility,
        failures,
    })
}

/// The utility of checkpoint `model`/`version` when it breaks no constraint, else
/// `None`: the verdict of [`score`] under [`Detail::Verdict`], for scanning every model
/// under `auto` without building a [`Scored`] per candidate. The same checks on the same
/// numbers, in the same order (the `fast_verdict_matches_score` test holds them equal).
pub(crate) fn qualifying_utility(
    ctx: &Context,
    model: usize,
    version: usize,
    engine: &dyn EngineView,
) -> Option<f64> {
    let m = ctx.policy.compiled.models.get(model)?;
    let (quality, cost) = static_verdict(ctx, model, m)?;
    live_utility(ctx, model, version, m, quality, cost, engine)
}

/// The constraints of [`qualifying_utility`] that need only the policy and the request,
/// with the model's quality and estimated cost when it passes them. Under `auto` the
/// scan decides these for a block of models at once ([`crate::scan::pass`]).
pub(crate) fn static_verdict(ctx: &Context, model: usize, m: &Model) -> Option<(f64, f64)> {
    // The request's constants are decided once, in [`Context::new`] (`scan`).
    let scan = &ctx.scan;
    if scan
        .allowed
        .is_some_and(|a| !a.get(model).copied().unwrap_or(false))
    {
        return None;
    }
    let quality = if ctx.tag_ids.is_empty() {
        m.quality
    } else {
        ctx.quality(model, m).0
    };
    // A missing floor or ceiling is -inf or +inf, which no finite number crosses (and
    // NaN compares false either way, as `is_some_and` did). Costs are never NaN (prices
    // are finite, validated at load), so `cost > room` is `score`'s `!(cost <= room)`.
    let cost = ctx.estimate(m).cost;
    if quality < scan.quality_floor
        || cost > scan.cost_ceiling
        || !scan.tokens_fit
        || cost > ctx.budget_room.cost
        || ctx.context_needed > u64::from(m.context_limit)
        || !ctx.worst_case_fits(m)
    {
        return None;
    }
    Some((quality, cost))
}

/// The rest of [`qualifying_utility`] for a candidate that passed [`static_verdict`]
/// with `quality` and `cost`: live engine state (health, queue, latency) and utility.
#[inline(always)]
pub(crate) fn live_utility(
    ctx: &Context,
    model: usize,
    version: usize,
    m: &Model,
    quality: f64,
    cost: f64,
    engine: &dyn EngineView,
) -> Option<f64> {
    let key = CheckpointKey {
        model: &m.name,
        version: m.versions.get(version)?,
        probe: ctx
            .policy
            .live
            .probes
            .get(ctx.policy.compiled.checkpoint_slot(model, version)?)?,
    };
    let state = engine.state_at(&key);
    if !state.healthy
        || m.max_queue_depth
            .is_some_and(|max| state.queue_depth >= max)
    {
        return None;
    }
    let expected_latency_ms = state.expected_latency_ms(ctx.output_tokens);
    if latency_limit(ctx.max_latency_ms, m.latency_target_ms)
        .is_some_and(|(limit_ms, _)| expected_latency_ms > limit_ms)
    {
        return None;
    }
    Some(utility(ctx, quality, cost, expected_latency_ms))
}

/// The tighter of the request's and the model's latency limits.
pub(crate) fn latency_limit(
    request: Option<f64>,
    model: Option<f64>,
) -> Option<(f64, LatencyLimit)> {
    match (request, model) {
        (Some(r), Some(m)) if m < r => Some((m, LatencyLimit::Model)),
        (Some(r), _) => Some((r, LatencyLimit::Request)),
        (None, Some(m)) => Some((m, LatencyLimit::Model)),
        (None, None) => None,
    }
}

/// Pick order: higher utility first, then model name, then version name (ascending).
pub(crate) fn pick_order(policy: &Policy, a: &Scored, b: &Scored) -> Ordering {
    order(
        policy,
        (a.utility, a.model, a.version),
        (b.utility, b.model, b.version),
    )
}

/// [`pick_order`] on `(utility, model, version)`.
#[inline]
pub(crate) fn order(policy: &Policy, a: (f64, usize, usize), b: (f64, usize, usize)) -> Ordering {
    b.0.total_cmp(&a.0).then_with(|| {
        let name = |(_, model, version): (f64, usize, usize)| {
            policy
                .compiled
                .models
                .get(model)
                .map(|m| (&m.name, m.versions.get(version)))
        };
        name(a).cmp(&name(b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authenticate::caller_tenant;
    use crate::engine_view::{CandidateState, StaticEngineView};
    use crate::plan::Plan;
    use crate::request::{Caller, ModelHint, RouteRequest};
    use crate::scan;
    use proptest::prelude::*;

    /// Models with every constraint set, a tenant allowed some of them with a token and
    /// a cost budget, so every check of the fast verdict can decide.
    fn policy(
        models: &[(u16, u16, u8, u8, u16, u8)],
        allowed: &[bool],
        budgets: (u32, u32),
    ) -> Policy {
        let mut src = String::from("[routing]\ncost_weight = 3.0\nlatency_weight = 0.001\n");
        for (i, &(cost_in, cost_out, quality, code, context, queue)) in models.iter().enumerate() {
            src.push_str(&format!(
                "[[models]]\nname = \"m{i}\"\nversion = \"v1\"\ncost_per_1k_input = {:?}\n\
                 cost_per_1k_output = {:?}\nquality = {:?}\nquality_by_tag = {{ code = {:?} }}\n\
                 context_limit = {}\nlatency_target_ms = 900.0\nmax_queue_depth = {}\n",
                f64::from(cost_in) / 1e4,
                f64::from(cost_out) / 1e4,
                f64::from(quality) / 100.0,
                f64::from(code) / 100.0,
                u32::from(context) + 1,
                u32::from(queue) + 1,
            ));
        }
        let allowed: Vec<String> = (0..models.len())
            .filter(|&i| allowed.get(i).copied().unwrap_or(true))
            .map(|i| format!("\"m{i}\""))
            .collect();
        src.push_str(&format!(
            "[[tenants]]\nname = \"t\"\nallowed_models = [{}]\n\
             [[tenants.budgets]]\nwindow = \"1h\"\nlimit_tokens = {}\n\
             [[tenants.budgets]]\nwindow = \"1d\"\nlimit_cost = {:?}\n",
            allowed.join(", "),
            budgets.0,
            f64::from(budgets.1) / 1e4,
        ));
        Policy::from_toml_str(&src).expect("test policy is valid")
    }

    /// Tenant `t`'s `auto` request with these hints (a quality floor in hundredths, a
    /// cost ceiling in ten-thousandths, a latency limit in ms, whether it is tagged
    /// `code`) and tokens (prompt, `max_tokens`).
    fn auto_request(
        hints: (Option<u8>, Option<u32>, Option<u32>, bool),
        tokens: (u32, Option<u32>),
    ) -> RouteRequest {
        let mut req = RouteRequest::new(ModelHint::Auto, Caller::Tenant("t".into()));
        req.hints.min_quality = hints.0.map(|q| f64::from(q) / 100.0);
        req.hints.max_cost = hints.1.map(|c| f64::from(c) / 1e4);
        req.hints.max_latency_ms = hints.2.map(f64::from);
        if hints.3 {
            req.hints.tags = vec!["code".into()];
        }
        req.prompt_tokens = tokens.0;
        req.max_output_tokens = tokens.1;
        req
    }

    /// The hints [`auto_request`] takes.
    fn hints() -> impl Strategy<Value = (Option<u8>, Option<u32>, Option<u32>, bool)> {
        (
            prop::option::of(0u8..=100),
            prop::option::of(0u32..400),
            prop::option::of(1u32..2000),
            any::<bool>(),
        )
    }

    /// The engine state of [`policy`]'s `models` models, taking `states` in turn.
    fn engine(states: &[CandidateState], models: usize) -> StaticEngineView {
        let mut engine = StaticEngineView::default();
        for (i, state) in (0..models).zip(states.iter().cycle()) {
            engine.checkpoints.insert(format!("m{i}@v1"), *state);
        }
        engine
    }

    fn state() -> impl Strategy<Value = CandidateState> {
        (any::<bool>(), 0u32..6, 0u32..600, 0u32..800, any::<bool>()).prop_map(
            |(resident, queue_depth, wait, swap, healthy)| CandidateState {
                resident,
                queue_depth,
                est_queue_wait_ms: f64::from(wait),
                est_swap_or_load_ms: f64::from(swap),
                est_ms_per_token: 1.5,
                healthy,
            },
        )
    }

    proptest! {
        /// The per-request estimate is bit for bit what the reservation's price gives.
        #[test]
        fn estimate_is_price_spend(prompt in 0u32..200_000, out in 0u32..200_000, cin in 0u16..60_000, cout in 0u16..60_000) {
            let p = policy(&[(cin, cout, 50, 50, 100, 1)], &[true], (1, 1));
            let mut req = RouteRequest::new(ModelHint::Auto, Caller::Tenant("t".into()));
            req.prompt_tokens = prompt;
            req.max_output_tokens = Some(out);
            let ctx = Context::new(&p, caller_tenant(&p, &req.caller).unwrap(), &req);
            let m = &p.models()[0];
            let reference = m.price().spend(u64::from(prompt), u64::from(out));
            let fast = ctx.estimate(m);
            prop_assert_eq!(fast.tokens, reference.tokens);
            prop_assert_eq!(fast.cost.to_bits(), reference.cost.to_bits());
        }

        /// `qualifying_utility` says exactly what `score` under `Verdict` says, for every
        /// candidate, whatever breaks (permission, quality, cost, each budget, context,
        /// health, queue, latency).
        #[test]
        fn fast_verdict_matches_score(
            models in prop::collection::vec(
                (0u16..400, 0u16..900, 0u8..=100, 0u8..=100, 0u16..3000, 0u8..5),
                1..8,
            ),
            states in prop::collection::vec(state(), 8),
            allowed in prop::collection::vec(prop::bool::weighted(0.8), 8),
            budgets in (1u32..3000, 1u32..400),
            hints in hints(),
            tokens in (0u32..2000, prop::option::of(1u32..1000)),
        ) {
            let policy = policy(&models, &allowed, budgets);
            let engine = engine(&states, models.len());
            let req = auto_request(hints, tokens);
            let ctx = Context::new(&policy, caller_tenant(&policy, &req.caller).unwrap(), &req);
            for model in 0..models.len() {
                let full = score(&ctx, model, 0, Via::Direct, &engine, Detail::Verdict);
                let fast = qualifying_utility(&ctx, model, 0, &engine);
                prop_assert_eq!(fast, full.as_ref().map(|s| s.utility), "model m{}", model);
                let all = score(&ctx, model, 0, Via::Direct, &engine, Detail::All);
                prop_assert_eq!(fast.is_some(), all.is_some_and(|s| s.qualifies()));
            }
        }

        /// Under `auto` the columnar form of the objective (the block scan, then each
        /// survivor's live utility) picks the candidate the plain form picks (every
        /// candidate scored in full, the best qualifying one in pick order), with the same
        /// utility bits and the same count of qualifying candidates, across block
        /// boundaries (up to 150 models: three blocks) and ties.
        #[test]
        fn columnar_pick_matches_the_plain_pick(
            models in prop::collection::vec(
                (0u16..40, 0u16..90, 0u8..=100, 0u8..=100, 0u16..3000, 0u8..5),
                1..150,
            ),
            states in prop::collection::vec(state(), 8),
            allowed in prop::collection::vec(prop::bool::weighted(0.8), 8),
            budgets in (1u32..3000, 1u32..400),
            hints in hints(),
            tokens in (0u32..2000, prop::option::of(1u32..1000)),
        ) {
            let policy = policy(&models, &allowed, budgets);
            let engine = engine(&states, models.len());
            let req = auto_request(hints, tokens);
            let tenant = caller_tenant(&policy, &req.caller).unwrap();
            let ctx = Context::new(&policy, tenant, &req);
            let plan = Plan::new(&policy, &req, caller_tenant(&policy, &req.caller).unwrap()).unwrap();
            let plain: Vec<Scored> = plan
                .score_primary(&ctx, &engine, Detail::All)
                .into_iter()
                .filter(Scored::qualifies)
                .collect();
            let plain_best = plain.iter().min_by(|a, b| pick_order(&policy, a, b));
            let (columnar_best, qualifying) = plan.best_primary(&ctx, &engine);
            let key = |s: &Scored| (s.model, s.version, s.utility.to_bits());
            prop_assert_eq!(columnar_best.as_ref().map(key), plain_best.map(key));
            prop_assert_eq!(qualifying, plain.len());
        }

        /// The `auto` scan's block pass decides the policy-and-request constraints as
        /// `static_verdict` does, model by model, with the same quality and cost bits.
        #[test]
        fn static_pass_matches_the_fast_verdict(
            models in prop::collection::vec(
                (0u16..400, 0u16..900, 0u8..=100, 0u8..=100, 0u16..3000, 0u8..5),
                1..8,
            ),
            allowed in prop::collection::vec(prop::bool::weighted(0.8), 8),
            budgets in (1u32..3000, 1u32..400),
            hints in (prop::option::of(0u8..=100), prop::option::of(0u32..400), any::<bool>()),
            tokens in (0u32..2000, prop::option::of(1u32..1000)),
        ) {
            let policy = policy(&models, &allowed, budgets);
            let req = auto_request((hints.0, hints.1, None, hints.2), tokens);
            let ctx = Context::new(&policy, caller_tenant(&policy, &req.caller).unwrap(), &req);
            let pass = scan::pass(&ctx, 0);
            for (model, m) in policy.models().iter().enumerate() {
                let verdict = static_verdict(&ctx, model, m);
                prop_assert_eq!(pass.passed >> model & 1 == 1, verdict.is_some(), "model m{}", model);
                if let Some((quality, cost)) = verdict {
                    prop_assert_eq!(pass.quality[model].to_bits(), quality.to_bits());
                    prop_assert_eq!(pass.cost[model].to_bits(), cost.to_bits());
                }
            }
            prop_assert_eq!(pass.passed >> models.len(), 0, "no bits past the last model");
        }
    }
}
