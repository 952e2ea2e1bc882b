//! A tenant of the compiled policy: who may use what, with which defaults, within which
//! budgets.

use std::sync::Arc;

use switchyard_seam::CacheScope;

use super::rate_limit::RateLimits;
use crate::request::Hints;
use crate::spend::BudgetUnit;

/// A tenant: who may use what, and how much.
#[derive(Debug)]
pub struct Tenant {
    /// Unique name.
    pub name: Arc<str>,
    /// Per model index, whether the tenant may use it; `None` allows all.
    pub allowed: Option<Vec<bool>>,
    /// Hints applied when a request does not set them.
    pub default_hints: Hints,
    /// Spend budgets, all of which must cover a request. What each has spent lives in
    /// the policy's live state ([`crate::Policy::budgets`]).
    pub budgets: Vec<Budget>,
    /// Whose cached prompt blocks its requests read: its own, or the shared
    /// scope its entry names (`cache_scope = "team-a"`).
    pub cache_scope: CacheScope,
    /// Requests and tokens per minute of all the tenant's requests together.
    pub rate_limits: RateLimits,
    /// Requests and tokens per minute of each of its API keys alone.
    pub key_rate_limits: RateLimits,
    /// Its share of the engine's batch slots when requests queue, against the other
    /// tenants' weights (1 unless the file says).
    pub weight: u32,
    /// The most of the engine's KV budget its running sequences may reserve together
    /// (and of its waiting queue its requests may fill), in thousandths; `None`: the
    /// policy's default ([`crate::Policy::kv_permille`]).
    pub kv_share: Option<u16>,
}

impl Tenant {
    /// Whether the tenant may use model `model` (an index into [`crate::Policy::models`]).
    pub fn may_use(&self, model: usize) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|a| a.get(model).copied().unwrap_or(false))
    }
}

/// One budget as the file sets it: a limit in tokens or currency per window.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    unit: BudgetUnit,
    window_secs: u64,
    limit: f64,
    label: Arc<str>,
}

impl Budget {
    /// A limit of `limit` per window of `window_secs` seconds (at least 1).
    pub fn new(unit: BudgetUnit, window_secs: u64, limit: f64) -> Self {
        let window_secs = window_secs.max(1);
        Budget {
            unit,
            window_secs,
            limit,
            label: unit.label(window_secs),
        }
    }

    /// Tokens or cost.
    pub fn unit(&self) -> BudgetUnit {
        self.unit
    }

    /// Window length in seconds.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }

    /// Limit per window.
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// A short label such as `tokens per 3600s`.
    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    /// Same unit and window length: one tenant's spend against it carries over a reload.
    pub(crate) fn same_window(&self, other: &Budget) -> bool {
        self.unit == other.unit && self.window_secs == other.window_secs
    }
}
