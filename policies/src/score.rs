//! Scoring one candidate checkpoint: its constraints and its utility.
//!
//! A candidate qualifies when it breaks no constraint. Among those that qualify the
//! policy picks the highest utility
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

use std::cmp::Ordering;

use crate::budget::{now_secs, Price, Spend};
use crate::constraint::{ConstraintFailure, LatencyLimit};
use crate::engine::EngineView;
use crate::policy::{Policy, Tenant};
use crate::request::RouteRequest;

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

/// What every candidate of one request is measured against.
pub(crate) struct Context<'a> {
    pub policy: &'a Policy,
    pub tenant: Option<&'a Tenant>,
    pub min_quality: Option<f64>,
    pub max_cost: Option<f64>,
    pub max_latency_ms: Option<f64>,
    pub tags: &'a [String],
    /// Each of `tags` as an id of the policy's tag table (`None`: no model scores it).
    pub tag_ids: Vec<Option<usize>>,
    pub prompt_tokens: u64,
    /// `max_tokens`, or the assumed output length, for cost and latency estimates.
    pub output_tokens: u64,
    /// Prompt plus `max_tokens` (0 when unset), for the context limit.
    pub context_needed: u64,
    /// Remaining amount per tenant budget, read once per request.
    pub budget_remaining: Vec<f64>,
}

impl<'a> Context<'a> {
    /// Request hints win; the tenant's defaults fill what the request leaves unset.
    pub fn new(policy: &'a Policy, tenant: Option<&'a Tenant>, req: &'a RouteRequest) -> Self {
        let defaults = tenant.map(|t| &t.default_hints);
        let pick = |own: Option<f64>, default: fn(&crate::request::Hints) -> Option<f64>| {
            own.or_else(|| defaults.and_then(default))
        };
        let tags: &[String] = if req.hints.tags.is_empty() {
            defaults.map_or(&[], |d| &d.tags[..])
        } else {
            &req.hints.tags
        };
        let now = now_secs();
        Context {
            policy,
            tenant,
            min_quality: pick(req.hints.min_quality, |d| d.min_quality),
            max_cost: pick(req.hints.max_cost, |d| d.max_cost),
            max_latency_ms: pick(req.hints.max_latency_ms, |d| d.max_latency_ms),
            tags,
            tag_ids: tags.iter().map(|t| policy.tags.id(t)).collect(),
            prompt_tokens: u64::from(req.prompt_tokens),
            output_tokens: u64::from(
                req.max_output_tokens
                    .unwrap_or(policy.routing.assumed_output_tokens),
            ),
            context_needed: u64::from(req.prompt_tokens)
                + u64::from(req.max_output_tokens.unwrap_or(0)),
            budget_remaining: tenant
                .map(|t| t.budgets.iter().map(|b| b.remaining_at(now)).collect())
                .unwrap_or_default(),
        }
    }

    /// The price of a model, for estimates and settling.
    pub fn price(&self, model: usize) -> Price {
        self.policy
            .models
            .get(model)
            .map_or(Price::default(), |m| Price {
                per_1k_input: m.cost_per_1k_input,
                per_1k_output: m.cost_per_1k_output,
            })
    }
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
    let m = ctx.policy.models.get(model)?;
    let version_name = m.versions.get(version)?;
    let verdict = detail == Detail::Verdict;
    // Every broken constraint, in report order (under Verdict the first one returns).
    let mut failures = Vec::new();

    if let Some(t) = ctx.tenant {
        if !t.may_use(model) {
            if verdict {
                return None;
            }
            failures.push(ConstraintFailure::NotPermitted {
                tenant: t.name.clone(),
            });
        }
    }
    let (quality, quality_tag) = ctx.policy.tags.quality(model, m.quality, &ctx.tag_ids);
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
    let estimate = ctx.price(model).spend(ctx.prompt_tokens, ctx.output_tokens);
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
    if let Some(t) = ctx.tenant {
        for (budget, &remaining) in t.budgets.iter().zip(&ctx.budget_remaining) {
            let needed = match budget.unit() {
                crate::budget::BudgetUnit::Tokens => estimate.tokens as f64,
                crate::budget::BudgetUnit::Cost => estimate.cost,
            };
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

    let state = engine.state(&m.name, version_name);
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
    let r = &ctx.policy.routing;
    let utility = r.quality_weight * quality
        - weighted(r.cost_weight, estimate.cost)
        - weighted(r.latency_weight, expected_latency_ms);
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

/// `weight × value`, where a zero weight ignores the value even when it is infinite.
fn weighted(weight: f64, value: f64) -> f64 {
    if weight == 0.0 {
        0.0
    } else {
        weight * value
    }
}

/// Pick order: higher utility first, then model name, then version name (ascending).
pub(crate) fn pick_order(policy: &Policy, a: &Scored, b: &Scored) -> Ordering {
    b.utility.total_cmp(&a.utility).then_with(|| {
        let name = |s: &Scored| {
            policy
                .models
                .get(s.model)
                .map(|m| (&m.name, m.versions.get(s.version)))
        };
        name(a).cmp(&name(b))
    })
}
