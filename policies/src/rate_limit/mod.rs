//! Rate limits per tenant and per API key: requests and tokens per minute.
//!
//! The policy file sets the limits (`rate_limits` and `key_rate_limits` on a tenant:
//! see [`crate::RateLimits`]); a [`RateLedger`] keeps what each subject has used in its
//! current minute. The ledger is a trait so that the counts can move into a ledger
//! shared between instances (the one budgets use) without the router changing:
//! [`LocalRateLedger`] keeps them in the process, [`SharedRateLedger`] in a spend
//! ledger that instances share (Redis), chosen by [`rate_ledger_for`]. The counts are keyed by tenant name
//! and key digest, not by the policy, so a reload changes the limits and keeps the
//! counts.
//!
//! ```
//! use switchyard_policies::{Caller, LocalRateLedger, Policy, RateLedger};
//!
//! let policy = Policy::from_toml_str(r#"
//!     [[models]]
//!     name = "m"
//!     version = "v1"
//!     cost_per_1k_input = 0.0
//!     cost_per_1k_output = 0.0
//!     quality = 0.5
//!     context_limit = 4096
//!
//!     [[tenants]]
//!     name = "a"
//!     api_keys = ["sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"]
//!     rate_limits = { requests_per_minute = 2 }
//! "#)?;
//! let ledger = LocalRateLedger::default();
//! let caller = Caller::ApiKey("foo".into());
//! let claims = policy.rate_claims(&caller, 10);
//! assert!(ledger.take(&claims, 0).allowed);
//! assert!(ledger.take(&claims, 1_000).allowed);
//! let third = ledger.take(&claims, 2_000);
//! assert!(!third.allowed);
//! assert_eq!(third.requests.map(|q| (q.limit, q.remaining)), Some((2, 0)));
//! assert!(ledger.take(&claims, 60_000).allowed, "a new minute");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod choose;
mod claims;
mod local;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use crate::compiled::rate_limit::RateLimits;
use crate::keys::KeyDigest;

pub use choose::rate_ledger_for;
pub use local::LocalRateLedger;
pub use shared::SharedRateLedger;

/// The length of a rate-limit window.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Whose use a limit counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateSubject {
    /// Every request of a tenant.
    Tenant(Arc<str>),
    /// The requests made with one API key (by its digest).
    Key(KeyDigest),
}

/// One limit a request must fit: its subject, the limits, and what it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct RateClaim {
    /// Whose window.
    pub subject: RateSubject,
    /// The limits of that window.
    pub limits: RateLimits,
    /// Tokens the request counts.
    pub tokens: u64,
}

/// One kind of limit after a request: OpenAI's `x-ratelimit-*-{requests,tokens}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The limit per window.
    pub limit: u64,
    /// What is left of it in the current window.
    pub remaining: u64,
    /// Until the window starts again (with the whole limit).
    pub reset: Duration,
}

/// What a ledger decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateDecision {
    /// Whether the request was let through (and counted).
    pub allowed: bool,
    /// The tightest request limit among the claims (least remaining), if any.
    pub requests: Option<Quota>,
    /// The tightest token limit among the claims, if any.
    pub tokens: Option<Quota>,
    /// When refused: how long until every claim that had no room starts a new window.
    pub retry_after: Duration,
}

/// Keeps what each subject used in its current window.
pub trait RateLedger: Send + Sync + std::fmt::Debug {
    /// Counts one request and its tokens against every claim if every one has room
    /// (all or nothing); `now_ms` is the wall clock in milliseconds.
    fn take(&self, claims: &[RateClaim], now_ms: u64) -> RateDecision;
}

impl Quota {
    /// Of two quotas of one kind, the one with less left (the one a client meets).
    fn tighter(a: Option<Quota>, b: Quota) -> Option<Quota> {
        match a {
            Some(a) if a.remaining <= b.remaining => Some(a),
            _ => Some(b),
        }
    }
}
