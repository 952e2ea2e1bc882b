//! Metric hooks through the `metrics` facade. Without an installed recorder they cost a
//! check and nothing more; the router installs the Prometheus exporter.
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `switchyard_policy_routed_total` | counter | model, version, arm, reason |
//! | `switchyard_policy_rejected_total` | counter | constraint (each that refused a candidate of a failed request) |
//! | `switchyard_policy_route_errors_total` | counter | kind |
//! | `switchyard_policy_spend_tokens_total` | counter | tenant |
//! | `switchyard_policy_spend_cost_micros_total` | counter | tenant (cost × 1e6) |
//! | `switchyard_policy_split_arm_total` | counter | split, arm |
//! | `switchyard_policy_rollback_tripped` | gauge | split (1 rolled back, 0 watching) |
//! | `switchyard_policy_reloads_total` | counter | result (`ok` or `error`) |

use std::sync::Arc;

use metrics::{counter, gauge};

use crate::budget::Spend;
use crate::route::Route;
use crate::route_error::RouteError;

/// Requests routed, by model, version, arm and reason.
pub const ROUTED: &str = "switchyard_policy_routed_total";
/// Failed requests, by each constraint that refused a candidate.
pub const REJECTED: &str = "switchyard_policy_rejected_total";
/// Failed requests, by error kind.
pub const ROUTE_ERRORS: &str = "switchyard_policy_route_errors_total";
/// Tokens spent, by tenant.
pub const SPEND_TOKENS: &str = "switchyard_policy_spend_tokens_total";
/// Cost spent in millionths of the policy currency, by tenant.
pub const SPEND_COST_MICROS: &str = "switchyard_policy_spend_cost_micros_total";
/// Requests per split arm.
pub const SPLIT_ARM: &str = "switchyard_policy_split_arm_total";
/// 1 when a split's rollback rule has tripped.
pub const ROLLBACK_TRIPPED: &str = "switchyard_policy_rollback_tripped";
/// Policy reloads, by result.
pub const RELOADS: &str = "switchyard_policy_reloads_total";

const NO_ARM: &str = "none";

pub(crate) fn routed(r: &Route) {
    let arm: metrics::SharedString = r.arm.clone().map_or(NO_ARM.into(), Into::into);
    counter!(ROUTED,
        "model" => Arc::clone(&r.model),
        "version" => Arc::clone(&r.version),
        "arm" => arm.clone(),
        "reason" => r.reason.as_str())
    .increment(1);
    if let Some(split) = &r.split {
        counter!(SPLIT_ARM, "split" => Arc::clone(split), "arm" => arm).increment(1);
    }
}

pub(crate) fn rejected(e: &RouteError) {
    let kind = match e.kind() {
        crate::RouteErrorKind::Unauthenticated => "unauthenticated",
        crate::RouteErrorKind::UnknownModel => "unknown_model",
        crate::RouteErrorKind::BudgetExhausted => "budget_exhausted",
        crate::RouteErrorKind::Unavailable => "unavailable",
        crate::RouteErrorKind::Unsatisfiable => "unsatisfiable",
    };
    counter!(ROUTE_ERRORS, "kind" => kind).increment(1);
    for constraint in e.failed_constraints() {
        counter!(REJECTED, "constraint" => constraint).increment(1);
    }
}

pub(crate) fn spend(tenant: &Arc<str>, spend: Spend) {
    counter!(SPEND_TOKENS, "tenant" => Arc::clone(tenant)).increment(spend.tokens);
    let micros = (spend.cost * 1e6).round();
    if micros.is_finite() && micros > 0.0 {
        counter!(SPEND_COST_MICROS, "tenant" => Arc::clone(tenant)).increment(micros as u64);
    }
}

pub(crate) fn rollback_state(split: &Arc<str>, tripped: bool) {
    gauge!(ROLLBACK_TRIPPED, "split" => Arc::clone(split)).set(if tripped { 1.0 } else { 0.0 });
}

pub(crate) fn reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}
