//! The constraints a candidate checkpoint must meet, and how each can fail.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

/// Names of all constraints, in the order they are checked (metric labels, explain rows).
pub const CONSTRAINTS: [&str; 8] = [
    "permission",
    "quality",
    "cost",
    "budget",
    "context",
    "health",
    "queue",
    "latency",
];

/// Who set a latency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyLimit {
    /// The request (`x-switchyard-max-latency-ms` or the tenant default).
    Request,
    /// The model's `latency_target_ms`.
    Model,
}

/// One broken constraint of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "constraint", rename_all = "snake_case")]
pub enum ConstraintFailure {
    /// The tenant may not use this model.
    NotPermitted {
        /// Tenant name.
        tenant: Arc<str>,
    },
    /// Quality (for the weakest requested tag) is below the floor.
    QualityBelowFloor {
        /// The tag that set the quality, if tags were given.
        tag: Option<String>,
        /// The model's quality.
        quality: f64,
        /// The requested floor.
        floor: f64,
    },
    /// The estimated cost exceeds the ceiling.
    CostAboveCeiling {
        /// Estimated cost of this request on this model.
        estimated: f64,
        /// The requested ceiling.
        ceiling: f64,
    },
    /// A tenant budget cannot cover the estimated spend.
    OverBudget {
        /// Which budget, e.g. `tokens per 3600s`.
        budget: Arc<str>,
        /// Estimated spend of this request.
        needed: f64,
        /// What is left in the current window.
        remaining: f64,
    },
    /// Prompt plus `max_tokens` exceed the model's context.
    ContextTooLong {
        /// Prompt tokens plus requested output tokens.
        needed: u64,
        /// The model's context limit.
        limit: u32,
    },
    /// The engine reports this checkpoint failing.
    Unhealthy,
    /// The checkpoint's queue is at its limit.
    QueueFull {
        /// Current depth.
        depth: u32,
        /// The model's `max_queue_depth`.
        max: u32,
    },
    /// Expected latency exceeds a limit.
    LatencyAboveTarget {
        /// Expected latency in milliseconds.
        expected_ms: f64,
        /// The limit in milliseconds.
        limit_ms: f64,
        /// Who set the limit.
        set_by: LatencyLimit,
    },
}

/// Why a fallback list may be tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    Overloaded,
    Failing,
    OverBudget,
}

impl ConstraintFailure {
    /// The constraint's name (one of [`CONSTRAINTS`]).
    pub fn name(&self) -> &'static str {
        match self {
            ConstraintFailure::NotPermitted { .. } => "permission",
            ConstraintFailure::QualityBelowFloor { .. } => "quality",
            ConstraintFailure::CostAboveCeiling { .. } => "cost",
            ConstraintFailure::OverBudget { .. } => "budget",
            ConstraintFailure::ContextTooLong { .. } => "context",
            ConstraintFailure::Unhealthy => "health",
            ConstraintFailure::QueueFull { .. } => "queue",
            ConstraintFailure::LatencyAboveTarget { .. } => "latency",
        }
    }

    /// Which fallback trigger this failure is, if any.
    pub(crate) fn trigger(&self) -> Option<Trigger> {
        match self {
            ConstraintFailure::QueueFull { .. } | ConstraintFailure::LatencyAboveTarget { .. } => {
                Some(Trigger::Overloaded)
            }
            ConstraintFailure::Unhealthy => Some(Trigger::Failing),
            ConstraintFailure::OverBudget { .. } => Some(Trigger::OverBudget),
            _ => None,
        }
    }
}

impl fmt::Display for ConstraintFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstraintFailure::NotPermitted { tenant } => {
                write!(f, "tenant `{tenant}` may not use this model")
            }
            ConstraintFailure::QualityBelowFloor {
                tag,
                quality,
                floor,
            } => match tag {
                Some(tag) => write!(
                    f,
                    "quality {quality:.3} for tag `{tag}` is below the floor {floor:.3}"
                ),
                None => write!(f, "quality {quality:.3} is below the floor {floor:.3}"),
            },
            ConstraintFailure::CostAboveCeiling { estimated, ceiling } => {
                write!(
                    f,
                    "estimated cost {estimated:.6} is above the ceiling {ceiling:.6}"
                )
            }
            ConstraintFailure::OverBudget {
                budget,
                needed,
                remaining,
            } => write!(
                f,
                "budget `{budget}` has {remaining:.6} left, the request needs {needed:.6}"
            ),
            ConstraintFailure::ContextTooLong { needed, limit } => write!(
                f,
                "prompt plus max_tokens is {needed} tokens, above the context limit {limit}"
            ),
            ConstraintFailure::Unhealthy => write!(f, "the checkpoint is failing"),
            ConstraintFailure::QueueFull { depth, max } => {
                write!(f, "queue depth {depth} is at the limit {max}")
            }
            ConstraintFailure::LatencyAboveTarget {
                expected_ms,
                limit_ms,
                set_by,
            } => {
                let who = match set_by {
                    LatencyLimit::Request => "the request's limit",
                    LatencyLimit::Model => "the model's latency target",
                };
                write!(
                    f,
                    "expected latency {expected_ms:.1} ms is above {who} of {limit_ms:.1} ms"
                )
            }
        }
    }
}
