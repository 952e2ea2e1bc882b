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
    /// The most of the engine's KV budget its running sequences may reserve together,
    /// and of the engine's waiting queue its requests may fill, in thousandths (1000:
    /// no cap beyond the engine's own). Past it, its further requests wait while other
    /// tenants' pass them, and past its queue share they are refused.
    pub kv_permille: u16,
}

impl Default for TenantShare {
    fn default() -> Self {
        TenantShare {
            tenant: None,
            weight: 1,
            kv_permille: TenantShare::WHOLE,
        }
    }
}

impl TenantShare {
    /// [`TenantShare::kv_permille`] of a tenant without a cap.
    pub const WHOLE: u16 = 1000;

    /// Tenant `name` of weight `weight` (0 counts as 1), without a KV cap.
    pub fn new(name: impl Into<Arc<str>>, weight: u32) -> Self {
        TenantShare {
            tenant: Some(name.into()),
            weight: weight.max(1),
            kv_permille: TenantShare::WHOLE,
        }
    }

    /// The same, allowed `permille` thousandths of the KV budget and queue (clamped to
    /// 1..=1000).
    pub fn with_kv_permille(self, permille: u16) -> Self {
        TenantShare {
            kv_permille: permille.clamp(1, TenantShare::WHOLE),
            ..self
        }
    }

    /// Its part of `whole` (bytes of the KV budget, queue slots): at least 1.
    pub fn part_of(&self, whole: usize) -> usize {
        let permille = usize::from(self.kv_permille.min(TenantShare::WHOLE));
        if permille >= usize::from(TenantShare::WHOLE) {
            return whole;
        }
        // Divide first: budgets run to gigabytes, and usize::MAX means no limit.
        (whole / 1000 * permille + whole % 1000 * permille / 1000).max(1)
    }
}
