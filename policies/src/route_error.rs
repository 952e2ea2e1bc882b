//! Why a request could not be routed, down to each candidate's broken constraints.

use serde::Serialize;

use crate::constraint::ConstraintFailure;

/// One candidate that did not qualify, and every constraint it broke.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejection {
    /// Model name.
    pub model: String,
    /// Version.
    pub version: String,
    /// The constraints it broke.
    pub failures: Vec<ConstraintFailure>,
}

/// Broad classes of routing errors, for mapping to HTTP status codes in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteErrorKind {
    /// No or unknown credentials (401).
    Unauthenticated,
    /// The model or version does not exist (404).
    UnknownModel,
    /// Every candidate was refused by a tenant budget (429).
    BudgetExhausted,
    /// Every candidate was overloaded or failing (503).
    Unavailable,
    /// The constraints cannot be met by any candidate (400/422).
    Unsatisfiable,
    /// The spend ledger could not be asked for a budget the request needs (503, retry).
    LedgerUnavailable,
}

/// Why routing failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteError {
    /// No API key and the policy does not allow anonymous requests.
    #[error("missing API key: send `Authorization: Bearer <key>`; this policy does not allow anonymous requests")]
    MissingApiKey,
    /// The API key matches no tenant.
    #[error("the API key is not known to the routing policy; check the key, or ask an operator to add its sha256 digest to a tenant")]
    UnknownApiKey,
    /// An authenticated tenant name is not in the (possibly reloaded) policy.
    #[error("tenant `{name}` is not in the routing policy; it may have been removed by a reload")]
    UnknownTenant {
        /// The tenant name.
        name: String,
    },
    /// The `model` field names no model or alias.
    #[error("unknown model `{name}`; use `auto` or one of: {known}")]
    UnknownModel {
        /// As requested.
        name: String,
        /// Known model names, comma-separated.
        known: String,
    },
    /// `name@version` names a version the model does not have.
    #[error("model `{model}` has no version `{version}`; its versions are: {known}")]
    UnknownVersion {
        /// Model as requested.
        model: String,
        /// Version as requested.
        version: String,
        /// Known versions, comma-separated.
        known: String,
    },
    /// The request needs a budget and the spend ledger cannot be reached (fail closed).
    #[error("the budget cannot be checked now ({reason}); retry shortly")]
    LedgerUnavailable {
        /// What failed.
        reason: String,
    },
    /// Every candidate broke at least one constraint.
    #[error("{}", no_candidate_message(hint, rejections))]
    NoCandidate {
        /// The `model` hint as given.
        hint: String,
        /// Each candidate with the constraints it broke.
        rejections: Vec<Rejection>,
    },
}

impl RouteError {
    /// The broad class of this error.
    pub fn kind(&self) -> RouteErrorKind {
        match self {
            RouteError::MissingApiKey
            | RouteError::UnknownApiKey
            | RouteError::UnknownTenant { .. } => RouteErrorKind::Unauthenticated,
            RouteError::UnknownModel { .. } | RouteError::UnknownVersion { .. } => {
                RouteErrorKind::UnknownModel
            }
            RouteError::LedgerUnavailable { .. } => RouteErrorKind::LedgerUnavailable,
            RouteError::NoCandidate { rejections, .. } => {
                let all = |f: fn(&ConstraintFailure) -> bool| {
                    !rejections.is_empty() && rejections.iter().all(|r| r.failures.iter().any(f))
                };
                if all(|f| matches!(f, ConstraintFailure::OverBudget { .. })) {
                    RouteErrorKind::BudgetExhausted
                } else if all(|f| {
                    matches!(
                        f,
                        ConstraintFailure::Unhealthy
                            | ConstraintFailure::QueueFull { .. }
                            | ConstraintFailure::LatencyAboveTarget { .. }
                    )
                }) {
                    RouteErrorKind::Unavailable
                } else {
                    RouteErrorKind::Unsatisfiable
                }
            }
        }
    }

    /// Each constraint that rejected at least one candidate, once (metric labels).
    pub fn failed_constraints(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        if let RouteError::NoCandidate { rejections, .. } = self {
            for f in rejections.iter().flat_map(|r| &r.failures) {
                if !names.contains(&f.name()) {
                    names.push(f.name());
                }
            }
        }
        names
    }
}

fn no_candidate_message(hint: &str, rejections: &[Rejection]) -> String {
    let mut msg = format!("no checkpoint meets the constraints for model `{hint}`");
    if rejections.is_empty() {
        msg.push_str(": the policy has no candidate models");
    }
    for (i, r) in rejections.iter().enumerate() {
        msg.push_str(if i == 0 { ": " } else { "; " });
        msg.push_str(&format!("{}@{} (", r.model, r.version));
        for (j, f) in r.failures.iter().enumerate() {
            if j > 0 {
                msg.push_str(", ");
            }
            msg.push_str(&f.to_string());
        }
        msg.push(')');
    }
    msg
}
