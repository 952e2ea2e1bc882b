//! Explaining a routing decision: every candidate's constraint results, scores and the
//! pick, as text for people and as JSON for tools. Explaining reserves no budget and
//! records no metrics; otherwise it follows exactly the steps of [`crate::route`].

use std::fmt;

use serde::Serialize;
use switchyard_seam::CacheScope;

use crate::authenticate::caller_tenant;
use crate::compiled::model::QualityOrigin;
use crate::constraint::{ConstraintFailure, CONSTRAINTS};
use crate::context::Context;
use crate::engine_view::EngineView;
use crate::live::budget::Reservation;
use crate::plan::Plan;
use crate::policy::Policy;
use crate::request::{Hints, RouteRequest};
use crate::route::{build, select};
use crate::route_error::RouteError;
use crate::route_reason::RouteReason;
use crate::score::{latency_limit, Detail, Scored, Via};

/// One constraint of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Constraint name (one of [`CONSTRAINTS`]).
    pub constraint: &'static str,
    /// Whether the candidate meets it.
    pub passed: bool,
    /// The numbers behind the verdict.
    pub detail: String,
}

/// One candidate with its scores and checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateReport {
    /// Model name.
    pub model: String,
    /// Version.
    pub version: String,
    /// How it entered: `direct`, `split <name> arm <arm>` or `fallback #<n>`.
    pub role: String,
    /// False for fallbacks that routing would not try (their trigger did not occur).
    pub considered: bool,
    /// Quality used for scoring.
    pub quality: f64,
    /// Estimated cost of the request.
    pub estimated_cost: f64,
    /// Estimated prompt plus output tokens.
    pub estimated_tokens: u64,
    /// Expected latency in milliseconds.
    pub expected_latency_ms: f64,
    /// `quality_weight × quality − cost_weight × cost − latency_weight × latency`.
    pub utility: f64,
    /// Whether every check passed.
    pub qualifies: bool,
    /// Every constraint, in checking order.
    pub checks: Vec<Check>,
}

/// The chosen checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pick {
    /// Model name.
    pub model: String,
    /// Version.
    pub version: String,
    /// Split arm, if any.
    pub arm: Option<String>,
    /// Why.
    pub reason: RouteReason,
    /// The `x-switchyard-route` text.
    pub explanation: String,
    /// The `x-switchyard-cost` value.
    pub estimated_cost: f64,
}

/// A full account of how a request would be routed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// Policy source.
    pub policy: String,
    /// The `model` hint.
    pub model_hint: String,
    /// The tenant, if authenticated.
    pub tenant: Option<String>,
    /// Hints after tenant defaults were applied.
    pub effective_hints: Hints,
    /// The tenant's rate limits (`tenant: 60 requests/min; each key: none`), if any.
    pub rate_limits: Option<String>,
    /// Whose cached prompt blocks the request reads (`tenant:a`, `shared:team`,
    /// `deployment`).
    pub cache_scope: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens used for estimates.
    pub output_tokens: u64,
    /// Every candidate, primary ones first, then fallbacks.
    pub candidates: Vec<CandidateReport>,
    /// The pick, if any.
    pub pick: Option<Pick>,
    /// The routing error, if routing would fail.
    pub error: Option<String>,
    /// Where the candidates' `quality_from` figures came from: measured (with n and
    /// interval), or the declared figure and why (missing or stale measurement).
    pub measured_quality: Vec<QualityNote>,
}

/// One `quality_from` figure of a candidate model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityNote {
    /// Model name.
    pub model: String,
    /// Where the figure came from.
    #[serde(flatten)]
    pub origin: QualityOrigin,
}

/// Explains how `route` would decide `req` now (nothing is reserved or recorded).
pub fn explain(policy: &Policy, req: &RouteRequest, engine: &dyn EngineView) -> Explanation {
    let mut out = Explanation {
        policy: policy.source_name().to_string(),
        model_hint: req.model.to_string(),
        tenant: None,
        effective_hints: req.hints.clone(),
        rate_limits: None,
        cache_scope: CacheScope::deployment().label(),
        prompt_tokens: u64::from(req.prompt_tokens),
        output_tokens: 0,
        candidates: Vec::new(),
        pick: None,
        error: None,
        measured_quality: Vec::new(),
    };
    let tenant = match caller_tenant(policy, &req.caller) {
        Ok(t) => t,
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    out.tenant = tenant.map(|t| t.compiled.name.to_string());
    if let Some(t) = tenant {
        out.cache_scope = t.compiled.cache_scope.label();
        let (all, each) = (&t.compiled.rate_limits, &t.compiled.key_rate_limits);
        out.rate_limits = (all.is_set() || each.is_set())
            .then(|| format!("tenant: {}; each key: {}", all.describe(), each.describe()));
    }
    let ctx = Context::new(policy, tenant, req);
    out.output_tokens = ctx.output_tokens;
    out.effective_hints = Hints {
        min_quality: ctx.min_quality,
        max_cost: ctx.max_cost,
        max_latency_ms: ctx.max_latency_ms,
        tags: ctx.tags.to_vec(),
    };
    let plan = match Plan::new(policy, req, tenant) {
        Ok(p) => p,
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    let mut primary = plan.score_primary(&ctx, engine, Detail::All);
    let mut dry_run = |_: &Scored| Ok(Reservation::dry_run());
    let mut picked = select(policy, &mut primary, plan.ranked(), &mut dry_run).map(|p| (p, false));
    let triggered = plan.score_fallbacks(&ctx, &primary, engine);
    let considered = triggered.is_some();
    let mut fallbacks = triggered.unwrap_or_else(|| plan.score_all_fallbacks(&ctx, engine));
    if picked.is_none() && considered {
        picked = select(policy, &mut fallbacks, false, &mut dry_run).map(|p| (p, true));
    }
    if let Some(((i, reservation), from_fallbacks)) = picked {
        let list = if from_fallbacks { &fallbacks } else { &primary };
        let qualifying = list.iter().filter(|s| s.qualifies()).count();
        out.pick = build(&ctx, &plan, list, i, qualifying, reservation).map(|r| Pick {
            model: r.model.to_string(),
            version: r.version.to_string(),
            arm: r.arm.as_ref().map(|a| a.to_string()),
            reason: r.reason,
            explanation: r.explanation.clone(),
            estimated_cost: r.estimated_cost,
        });
    } else {
        out.error = Some(
            RouteError::NoCandidate {
                hint: plan.hint_text(),
                rejections: primary
                    .iter()
                    .chain(if considered { &fallbacks[..] } else { &[] })
                    .map(|s| s.rejection(policy))
                    .collect(),
            }
            .to_string(),
        );
    }
    out.candidates = primary
        .iter()
        .map(|s| report(&ctx, s, true))
        .chain(fallbacks.iter().map(|s| report(&ctx, s, considered)))
        .collect();
    out.measured_quality = quality_notes(policy, &out.candidates);
    out
}

/// The `quality_from` origins of every candidate's model, each model once.
fn quality_notes(policy: &Policy, candidates: &[CandidateReport]) -> Vec<QualityNote> {
    let mut notes: Vec<QualityNote> = Vec::new();
    for c in candidates {
        if notes.iter().any(|n| n.model == c.model) {
            continue;
        }
        let Some(from) = policy
            .model_index(&c.model)
            .and_then(|i| policy.models().get(i))
            .and_then(|m| m.quality_from.as_ref())
        else {
            continue;
        };
        notes.extend(from.origins.iter().map(|origin| QualityNote {
            model: c.model.clone(),
            origin: origin.clone(),
        }));
    }
    notes
}

fn report(ctx: &Context, s: &Scored, considered: bool) -> CandidateReport {
    let policy = ctx.policy;
    let model = policy.compiled.models.get(s.model);
    let role = match s.via {
        Via::Direct => "direct".to_string(),
        Via::Split { split, arm } => {
            let sp = policy.compiled.splits.get(split);
            format!(
                "split {} arm {}",
                sp.map_or("?", |sp| &*sp.name),
                sp.and_then(|sp| sp.arms.get(arm)).map_or("?", |a| &*a.name)
            )
        }
        Via::Fallback { rank } => format!("fallback #{}", rank + 1),
    };
    let checks = CONSTRAINTS
        .iter()
        .map(|&name| {
            let failed: Vec<String> = s
                .failures
                .iter()
                .filter(|f| f.name() == name)
                .map(ConstraintFailure::to_string)
                .collect();
            Check {
                constraint: name,
                passed: failed.is_empty(),
                detail: if failed.is_empty() {
                    pass_detail(ctx, s, name)
                } else {
                    failed.join("; ")
                },
            }
        })
        .collect();
    CandidateReport {
        model: model.map_or_else(String::new, |m| m.name.to_string()),
        version: model
            .and_then(|m| m.versions.get(s.version))
            .map_or_else(String::new, |v| v.to_string()),
        role,
        considered,
        quality: s.quality,
        estimated_cost: s.estimate.cost,
        estimated_tokens: s.estimate.tokens,
        expected_latency_ms: s.expected_latency_ms,
        utility: s.utility,
        qualifies: s.qualifies(),
        checks,
    }
}

/// Why a passed check passed, with its numbers.
fn pass_detail(ctx: &Context, s: &Scored, constraint: &str) -> String {
    let model = ctx.policy.compiled.models.get(s.model);
    match constraint {
        "permission" => match ctx.tenant {
            Some(t) => format!("tenant `{}` may use it", t.compiled.name),
            None => "anonymous request: no tenant restrictions".to_string(),
        },
        "quality" => match (ctx.min_quality, s.quality_tag.and_then(|i| ctx.tags.get(i))) {
            (Some(f), Some(tag)) => {
                format!("quality {:.3} (tag `{tag}`) >= floor {f:.3}", s.quality)
            }
            (Some(f), None) => format!("quality {:.3} >= floor {f:.3}", s.quality),
            (None, _) => format!("no floor (quality {:.3})", s.quality),
        },
        "cost" => match ctx.max_cost {
            Some(c) => format!("estimated {:.6} <= ceiling {c:.6}", s.estimate.cost),
            None => format!("no ceiling (estimated {:.6})", s.estimate.cost),
        },
        "budget" => match ctx.tenant.map_or(0, |t| t.compiled.budgets.len()) {
            0 => "no budgets".to_string(),
            n => format!(
                "{n} budget(s) cover {} tokens / {:.6}",
                s.estimate.tokens, s.estimate.cost
            ),
        },
        "context" => format!(
            "{} tokens <= limit {}",
            ctx.context_needed,
            model.map_or(0, |m| m.context_limit)
        ),
        "health" => "healthy".to_string(),
        "queue" => match model.and_then(|m| m.max_queue_depth) {
            Some(max) => format!("depth {} < limit {max}", s.queue_depth),
            None => format!("depth {}, no limit", s.queue_depth),
        },
        _ => match latency_limit(ctx.max_latency_ms, model.and_then(|m| m.latency_target_ms)) {
            Some((limit, _)) => format!(
                "expected {:.1} ms <= limit {limit:.1} ms",
                s.expected_latency_ms
            ),
            None => format!("expected {:.1} ms, no limit", s.expected_latency_ms),
        },
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "policy: {}", self.policy)?;
        writeln!(
            f,
            "request: model `{}`, tenant {}, prompt {} tokens, output {} tokens",
            self.model_hint,
            self.tenant.as_deref().unwrap_or("(anonymous)"),
            self.prompt_tokens,
            self.output_tokens
        )?;
        writeln!(
            f,
            "rate limits: {}; prompt cache scope: {}",
            self.rate_limits.as_deref().unwrap_or("none"),
            self.cache_scope
        )?;
        let h = &self.effective_hints;
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        writeln!(
            f,
            "hints: min_quality {}, max_cost {}, max_latency_ms {}, tags [{}]",
            opt(h.min_quality),
            opt(h.max_cost),
            opt(h.max_latency_ms),
            h.tags.join(", ")
        )?;
        writeln!(f, "candidates:")?;
        for c in &self.candidates {
            let verdict = match (c.qualifies, c.considered) {
                (_, false) => "not tried",
                (true, true) => "qualifies",
                (false, true) => "rejected",
            };
            writeln!(
                f,
                "  {}@{} [{}]  utility {}  quality {:.3}  cost {}  latency {:.1} ms  -> {verdict}",
                c.model,
                c.version,
                c.role,
                readable(c.utility),
                c.quality,
                readable(c.estimated_cost),
                c.expected_latency_ms
            )?;
            for check in &c.checks {
                let mark = if check.passed { "ok  " } else { "FAIL" };
                writeln!(f, "      {mark} {:<10} {}", check.constraint, check.detail)?;
            }
        }
        if !self.measured_quality.is_empty() {
            writeln!(f, "quality from measurements (quality_from):")?;
        }
        for note in &self.measured_quality {
            let o = &note.origin;
            let tag = o
                .tag
                .as_ref()
                .map_or_else(String::new, |t| format!(" tag `{t}`"));
            let used = match o.basis {
                "measured" => "measured".to_string(),
                "declared" => "declared figure used".to_string(),
                "overall" => "the overall figure used".to_string(),
                _ => "counted as 0 (no declared quality to fall back on)".to_string(),
            };
            writeln!(
                f,
                "  {}@{}{tag} on `{}`: {:.3}, {used} ({})",
                note.model, o.version, o.suite, o.used, o.measurement
            )?;
        }
        match (&self.pick, &self.error) {
            (Some(p), _) => write!(f, "pick: {}@{} ({})", p.model, p.version, p.explanation),
            (None, Some(e)) => write!(f, "no pick: {e}"),
            (None, None) => write!(f, "no pick"),
        }
    }
}

/// Four significant digits, so that the tiny utilities of cost-only weights
/// (costs of 1e-5 per request) do not all print as `-0.0000`.
fn readable(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || x.abs() >= 0.01 {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::readable;

    #[test]
    fn small_utilities_keep_their_digits() {
        assert_eq!(readable(-0.0000123), "-1.230e-5");
        assert_ne!(readable(-0.0000123), readable(-0.0000246));
        assert_eq!(readable(0.5), "0.5000");
        assert_eq!(readable(0.0), "0.0000");
    }
}
