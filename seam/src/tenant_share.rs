//! Whose request it is, for the engine's fair admission: when requests queue,
//! each tenant gets a share of the batch slots in proportion to its weight.

use std::sync::Arc;

/// The tenant a generation runs for and its weight in the policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantShare {
    /// The tenant; `None` for requests without one (no policy, anonymous), which
    /// share one slot count among themselves.
    pub tenant: Option<Arc<str>>,
    /// Its weight (at least 1): a tenant of weight 2 gets twice the running
    /// sequences of a tenant of weight 1 while both have requests waiting.
    pub weight: u32,
}

impl Default for TenantShare {
    fn default() -> Self {
        TenantShare {
            tenant: None,
            weight: 1,
        }
    }
}

impl TenantShare {
    /// Tenant `name` of weight `weight` (0 counts as 1).
    pub fn new(name: impl Into<Arc<str>>, weight: u32) -> Self {
        TenantShare {
            tenant: Some(name.into()),
            weight: weight.max(1),
        }
    }
}
