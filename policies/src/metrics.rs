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
//! | `switchyard_policy_rollbacks_total` | counter | split, signal (`errors`, `latency`, `confidence`, `feedback`, `eval`) |
//! | `switchyard_policy_reloads_total` | counter | result (`ok` or `error`) |

use std::sync::{Arc, OnceLock};

use metrics::{counter, gauge, Counter};

use crate::route_error::{RouteError, RouteErrorKind};
use crate::route_reason::RouteReason;
use crate::spend::Spend;

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
/// Automatic rollbacks, by split and the signal that tripped them.
pub const ROLLBACKS: &str = "switchyard_policy_rollbacks_total";
/// Policy reloads, by result.
pub const RELOADS: &str = "switchyard_policy_reloads_total";

const NO_ARM: &str = "none";

/// Counter handles a policy keeps, so that a routed request increments its counters
/// without looking its label set up in the recorder's registry (hashing four labels
/// costs more than the rest of the accounting). Each is registered on first use: by
/// then the server has installed its recorder, and a policy routed without one keeps
/// the no-op handles, as the macros would give it.
#[derive(Debug, Default)]
pub(crate) struct RouteCounters {
    /// Per checkpoint slot (the compiled policy's `checkpoint_base` + version), per reason
    /// of a route that no split arm decided ([`direct_reason`]).
    direct: Vec<[OnceLock<Counter>; DIRECT_REASONS]>,
    /// Per split, per arm: routed by the split, routed while rolled back, and the arm's
    /// traffic counter.
    arms: Vec<Vec<[OnceLock<Counter>; 3]>>,
}

const DIRECT_REASONS: usize = 5;

/// The slot of a reason no split arm decided; `None` for split reasons.
fn direct_reason(reason: RouteReason) -> Option<usize> {
    match reason {
        RouteReason::Auto => Some(0),
        RouteReason::Named => Some(1),
        RouteReason::Alias => Some(2),
        RouteReason::Pinned => Some(3),
        RouteReason::Fallback => Some(4),
        RouteReason::Split | RouteReason::RolledBack => None,
    }
}

impl RouteCounters {
    /// Empty handles for `checkpoints` checkpoints and splits with `arms[i]` arms.
    pub(crate) fn new(checkpoints: usize, arms: impl Iterator<Item = usize>) -> Self {
        RouteCounters {
            direct: (0..checkpoints).map(|_| Default::default()).collect(),
            arms: arms
                .map(|n| (0..n).map(|_| Default::default()).collect())
                .collect(),
        }
    }
}

/// The labels of one routed request.
pub(crate) struct RoutedLabels<'a> {
    pub model: &'a Arc<str>,
    pub version: &'a Arc<str>,
    pub split: Option<&'a Arc<str>>,
    pub arm: Option<&'a Arc<str>>,
    pub reason: RouteReason,
}

/// Where a route's counters live in [`RouteCounters`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouteKey {
    /// Checkpoint slot of the pick.
    pub checkpoint: usize,
    /// The split and arm that decided it, if any.
    pub split_arm: Option<(usize, usize)>,
}

pub(crate) fn routed(counters: &RouteCounters, key: RouteKey, r: &RoutedLabels) {
    let routed = || {
        let arm: metrics::SharedString = r.arm.map_or(NO_ARM.into(), |a| Arc::clone(a).into());
        counter!(ROUTED,
            "model" => Arc::clone(r.model),
            "version" => Arc::clone(r.version),
            "arm" => arm,
            "reason" => r.reason.as_str())
    };
    let arm_total = || match (r.split, r.arm) {
        (Some(split), Some(arm)) => Some(split_arm_counter(split, arm)),
        _ => None,
    };
    match (key.split_arm, direct_reason(r.reason)) {
        (Some((split, arm)), None) => {
            let Some(h) = counters.arms.get(split).and_then(|arms| arms.get(arm)) else {
                return uncached(routed, arm_total);
            };
            let [by_split, rolled_back, total] = h;
            let by_reason = if r.reason == RouteReason::RolledBack {
                rolled_back
            } else {
                by_split
            };
            by_reason.get_or_init(routed).increment(1);
            if let (Some(split), Some(arm)) = (r.split, r.arm) {
                total
                    .get_or_init(|| split_arm_counter(split, arm))
                    .increment(1);
            }
        }
        (_, Some(reason)) => match counters
            .direct
            .get(key.checkpoint)
            .and_then(|h| h.get(reason))
        {
            Some(handle) => handle.get_or_init(routed).increment(1),
            None => uncached(routed, arm_total),
        },
        (None, None) => uncached(routed, arm_total),
    }
}

fn split_arm_counter(split: &Arc<str>, arm: &Arc<str>) -> Counter {
    counter!(SPLIT_ARM, "split" => Arc::clone(split), "arm" => Arc::clone(arm))
}

/// A route whose key is outside the tables (not built by this policy): the labels are
/// looked up in the registry each time.
fn uncached(routed: impl Fn() -> Counter, arm_total: impl Fn() -> Option<Counter>) {
    routed().increment(1);
    if let Some(total) = arm_total() {
        total.increment(1);
    }
}

pub(crate) fn rejected(e: &RouteError) {
    let kind = match e.kind() {
        RouteErrorKind::Unauthenticated => "unauthenticated",
        RouteErrorKind::UnknownModel => "unknown_model",
        RouteErrorKind::BudgetExhausted => "budget_exhausted",
        RouteErrorKind::Unavailable => "unavailable",
        RouteErrorKind::Unsatisfiable => "unsatisfiable",
        RouteErrorKind::LedgerUnavailable => "ledger_unavailable",
    };
    counter!(ROUTE_ERRORS, "kind" => kind).increment(1);
    for constraint in e.failed_constraints() {
        counter!(REJECTED, "constraint" => constraint).increment(1);
    }
}

/// A tenant's name with its spend counters, registered on first use (see
/// [`RouteCounters`] for why).
#[derive(Debug)]
pub(crate) struct TenantMeter {
    name: Arc<str>,
    tokens: OnceLock<Counter>,
    cost_micros: OnceLock<Counter>,
}

impl TenantMeter {
    pub(crate) fn new(name: Arc<str>) -> Self {
        TenantMeter {
            name,
            tokens: OnceLock::new(),
            cost_micros: OnceLock::new(),
        }
    }

    /// Registers both spend counters with the installed recorder now (at 0), instead of
    /// on the tenant's first settled request.
    pub(crate) fn register(&self) {
        self.tokens();
        self.cost_micros();
    }

    fn tokens(&self) -> &Counter {
        self.tokens
            .get_or_init(|| counter!(SPEND_TOKENS, "tenant" => Arc::clone(&self.name)))
    }

    fn cost_micros(&self) -> &Counter {
        self.cost_micros
            .get_or_init(|| counter!(SPEND_COST_MICROS, "tenant" => Arc::clone(&self.name)))
    }
}

pub(crate) fn spend(tenant: &TenantMeter, spend: Spend) {
    tenant.tokens().increment(spend.tokens);
    let micros = (spend.cost * 1e6).round();
    if micros.is_finite() && micros > 0.0 {
        tenant.cost_micros().increment(micros as u64);
    }
}

pub(crate) fn rollback_state(split: &Arc<str>, tripped: bool) {
    gauge!(ROLLBACK_TRIPPED, "split" => Arc::clone(split)).set(if tripped { 1.0 } else { 0.0 });
}

pub(crate) fn rollback_tripped(split: &Arc<str>, signal: &'static str) {
    counter!(ROLLBACKS, "split" => Arc::clone(split), "signal" => signal).increment(1);
}

pub(crate) fn reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}
