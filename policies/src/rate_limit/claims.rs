//! Which limits a caller's request must fit under the current policy.

use std::sync::Arc;

use super::{RateClaim, RateSubject};
use crate::keys;
use crate::policy::Policy;
use crate::request::Caller;

impl Policy {
    /// The limits a request of `caller` taking `tokens` must fit: its tenant's
    /// `rate_limits` and, for a caller with an API key, the tenant's
    /// `key_rate_limits` counted for that key alone. None for an anonymous caller, an
    /// unknown key or a tenant without limits.
    pub fn rate_claims(&self, caller: &Caller, tokens: u64) -> Vec<RateClaim> {
        let (tenant, key) = match caller {
            Caller::Anonymous => return Vec::new(),
            Caller::ApiKey(key) => (self.authenticate(key), Some(keys::digest(key))),
            Caller::Tenant(name) => (self.tenant(name), None),
        };
        let Some(tenant) = tenant else {
            return Vec::new();
        };
        let mut claims = Vec::with_capacity(2);
        if tenant.rate_limits.is_set() {
            claims.push(RateClaim {
                subject: RateSubject::Tenant(Arc::clone(&tenant.name)),
                limits: tenant.rate_limits,
                tokens,
            });
        }
        if let Some(digest) = key.filter(|_| tenant.key_rate_limits.is_set()) {
            claims.push(RateClaim {
                subject: RateSubject::Key(digest),
                limits: tenant.key_rate_limits,
                tokens,
            });
        }
        claims
    }
}
