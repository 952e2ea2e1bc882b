//! The first step of routing: which tenant a request is charged to, if any.

use crate::compiled::tenant::Tenant;
use crate::live::TenantState;
use crate::policy::Policy;
use crate::request::Caller;
use crate::route_error::RouteError;

/// A tenant as routing reads it: what the file says of it and its live spend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TenantRef<'p> {
    pub compiled: &'p Tenant,
    pub live: &'p TenantState,
}

impl<'p> TenantRef<'p> {
    /// Tenant `index` of `policy`.
    fn at(policy: &'p Policy, index: usize) -> Option<Self> {
        Some(TenantRef {
            compiled: policy.compiled.tenants.get(index)?,
            live: policy.live.tenants.get(index)?,
        })
    }
}

/// The tenant behind the caller, or why there is none.
pub(crate) fn caller_tenant<'p>(
    policy: &'p Policy,
    caller: &Caller,
) -> Result<Option<TenantRef<'p>>, RouteError> {
    let compiled = &policy.compiled;
    match caller {
        Caller::Anonymous if compiled.routing.allow_anonymous => Ok(None),
        Caller::Anonymous => Err(RouteError::MissingApiKey),
        Caller::ApiKey(key) => compiled
            .key_owner(key)
            .and_then(|i| TenantRef::at(policy, i))
            .map(Some)
            .ok_or(RouteError::UnknownApiKey),
        Caller::Tenant(name) => compiled
            .tenant_index(name)
            .and_then(|i| TenantRef::at(policy, i))
            .map(Some)
            .ok_or_else(|| RouteError::UnknownTenant { name: name.clone() }),
    }
}
