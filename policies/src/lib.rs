//! Switchyard's routing policy: which checkpoint answers a request, and why.
//!
//! Operators write a TOML policy (models with costs and quality, tenants with API keys,
//! permissions and budgets, traffic splits with automatic rollback, fallbacks); clients
//! steer with the `model` field and `x-switchyard-*` hints. This crate validates the file
//! whole (every problem with its line and column), scores candidates against constraints
//! and live engine state, keeps budgets and split state, and hot-reloads the file. It
//! knows nothing of HTTP: the router turns requests into [`RouteRequest`]s and implements
//! [`EngineView`] over the engine.
//!
//! ```
//! use switchyard_policies::{Caller, IdleEngine, ModelHint, Policy, PolicyStore, RouteRequest, Usage, Completion};
//!
//! let policy = Policy::from_toml_str(r#"
//!     [routing]
//!     allow_anonymous = true
//!
//!     [[models]]
//!     name = "small"
//!     version = "v1"
//!     cost_per_1k_input = 0.01
//!     cost_per_1k_output = 0.02
//!     quality = 0.6
//!     context_limit = 8192
//!
//!     [[models]]
//!     name = "large"
//!     version = "v3"
//!     cost_per_1k_input = 0.5
//!     cost_per_1k_output = 1.5
//!     quality = 0.9
//!     context_limit = 8192
//! "#)?;
//! let store = PolicyStore::new(policy);
//!
//! let mut req = RouteRequest::new(ModelHint::parse("auto"), Caller::Anonymous);
//! req.hints.apply_header("x-switchyard-min-quality", "0.8")?;
//! req.prompt_tokens = 200;
//! req.max_output_tokens = Some(100);
//!
//! let route = store.route(&req, &IdleEngine)?;
//! assert_eq!((&*route.model, &*route.version), ("large", "v3"));
//! route.finish(Completion {
//!     usage: Usage { prompt_tokens: 180, cached_tokens: 0, completion_tokens: 64 },
//!     succeeded: true,
//!     latency_ms: 350.0,
//! });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The modules in layers, each using only those above it (`scripts/check-module-cycles.sh`
// holds every crate to that):
// - words every stage shares: the request, the engine view, constraints, amounts, reasons
//   and errors, number formatting, key digests, the file's schema, metric hooks;
// - the compiled policy (`compiled`: what the file says, immutable) and `validate`,
//   which builds it;
// - the spend ledger (`ledger`: where budget counters and usage records are kept);
// - the live state it feeds (`live`: budget windows, rollback monitors) and `policy`,
//   the two together, carried over on reload;
// - the stages of one routing decision: `authenticate`, `context`, `score`, `scan`,
//   `plan`, `route`, and `explain` beside it;
// - `reload`, the store that holds the current policy.
mod constraint;
mod decimal;
mod engine_view;
mod error;
mod keys;
mod measured;
pub mod metrics;
mod request;
mod route_error;
mod route_reason;
mod schema;
mod spend;

mod compiled;
mod validate;

pub mod calibrate;
pub mod feedback;
pub mod ledger;
mod live;
mod policy;

mod authenticate;
mod context;
mod explain;
mod plan;
mod rate_limit;
mod route;
mod scan;
mod score;

mod reload;

pub use compiled::cascade::{Cascade, Statistic, Verdict};
pub use compiled::model::{Fallback, Model, QualityFrom, QualityOrigin, Target, Triggers};
pub use compiled::rate_limit::RateLimits;
pub use compiled::split::{stable_hash, Arm, EvalDrop, RollbackRule, Split, Sticky};
pub use compiled::tenant::{Budget, Tenant};
pub use compiled::Routing;
pub use constraint::{ConstraintFailure, LatencyLimit, CONSTRAINTS};
pub use decimal::{fixed, push_fixed};
pub use engine_view::{
    CandidateState, CheckpointKey, CheckpointProbe, EngineView, IdleEngine, ProbeCell,
    StaticEngineView,
};
pub use error::{Diagnostic, PolicyError};
pub use explain::{explain, CandidateReport, Check, Explanation, Pick, QualityNote};
pub use keys::{digest as key_digest, digests_equal, sha256_hex, KeyDigest};
pub use live::budget::{BudgetSnapshot, BudgetWindow, Reservation};
pub use live::rollback::{ArmStats, RollbackMonitor, RollbackState, RollbackStatus};
pub use measured::{Measured, Measurement, NoMeasurements, QualitySource};
pub use policy::Policy;
pub use rate_limit::{
    rate_ledger_for, LocalRateLedger, Quota, RateClaim, RateDecision, RateLedger, RateSubject,
    SharedRateLedger, RATE_WINDOW,
};
pub use reload::{PolicyStore, PolicyWatcher};
pub use request::{
    estimate_tokens, Caller, HintError, Hints, ModelHint, RouteRequest, HEADER_CASCADE,
    HEADER_CONFIDENCE, HEADER_COST, HEADER_HANDOFF, HEADER_MAX_COST, HEADER_MAX_LATENCY_MS,
    HEADER_MIN_QUALITY, HEADER_MODEL, HEADER_ROUTE, HEADER_TAGS, HEADER_VERSION,
};
pub use route::{route, Completion, Route};
pub use route_error::{Rejection, RouteError, RouteErrorKind};
pub use route_reason::RouteReason;
pub use spend::{BudgetUnit, Spend, Usage};
