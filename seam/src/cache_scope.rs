//! Who may read a cached prompt block: the scope the engine's prompt cache
//! puts into its block hash chain.
//!
//! A prompt-cache hit is visible to the caller (`cached_tokens`, and a
//! shorter time to first token), so a cache shared between tenants tells
//! one tenant, block by block, what another sent. Every generation
//! therefore carries a [`CacheScope`]: blocks cached under one scope are
//! found only by requests of the same scope.
//!
//! - The router's policy sets the owner: a tenant's own scope by default,
//!   a named scope several tenants share when the policy says so
//!   (`cache_scope = "team-a"`), and one deployment-wide scope when there
//!   is no policy or no tenant (anonymous callers).
//! - A request's `cache_salt` (vLLM's field) narrows the scope further:
//!   only requests with the same owner and the same salt share blocks.
//!
//! ```
//! use switchyard_seam::CacheScope;
//!
//! let a = CacheScope::tenant("a");
//! assert_ne!(a.key(), CacheScope::tenant("b").key());
//! assert_ne!(a.key(), a.clone().with_salt(Some("s1")).key());
//! assert_eq!(a.label(), "tenant:a");
//! ```

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The scope of one generation's cached prompt blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CacheScope {
    owner: ScopeOwner,
    salt: Option<Arc<str>>,
}

/// Whose blocks: the part of a scope the policy decides.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum ScopeOwner {
    /// Every request of the deployment (no policy, or no tenant).
    #[default]
    Deployment,
    /// One tenant's requests only.
    Tenant(Arc<str>),
    /// The tenants whose policy entry names this scope.
    Shared(Arc<str>),
}

impl CacheScope {
    /// The one scope of a deployment without tenants.
    pub fn deployment() -> Self {
        CacheScope::default()
    }

    /// Tenant `name`'s own scope.
    pub fn tenant(name: impl Into<Arc<str>>) -> Self {
        CacheScope {
            owner: ScopeOwner::Tenant(name.into()),
            salt: None,
        }
    }

    /// The scope named `name` that several tenants share.
    pub fn shared(name: impl Into<Arc<str>>) -> Self {
        CacheScope {
            owner: ScopeOwner::Shared(name.into()),
            salt: None,
        }
    }

    /// This scope narrowed by a request's `cache_salt` (`None` leaves it).
    pub fn with_salt(self, salt: Option<&str>) -> Self {
        CacheScope {
            salt: salt.map(Arc::from),
            ..self
        }
    }

    /// Whose blocks.
    pub fn owner(&self) -> &ScopeOwner {
        &self.owner
    }

    /// Whether a `cache_salt` narrows it.
    pub fn is_salted(&self) -> bool {
        self.salt.is_some()
    }

    /// The owner as metrics and the admin API name it: `deployment`,
    /// `tenant:<name>` or `shared:<name>`. The salt is left out: it may be a
    /// secret of the caller's, and salted blocks count toward their owner.
    pub fn label(&self) -> String {
        match &self.owner {
            ScopeOwner::Deployment => "deployment".to_owned(),
            ScopeOwner::Tenant(name) => format!("tenant:{name}"),
            ScopeOwner::Shared(name) => format!("shared:{name}"),
        }
    }

    /// The hash that starts the scope's block hash chain. Equal scopes give
    /// equal keys within a process; the cache still compares the scope
    /// itself, so two scopes whose keys collide never share a block.
    pub fn key(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_salts_each_make_a_scope_of_their_own() {
        let scopes = [
            CacheScope::deployment(),
            CacheScope::tenant("a"),
            CacheScope::tenant("b"),
            CacheScope::shared("a"),
            CacheScope::tenant("a").with_salt(Some("x")),
            CacheScope::tenant("a").with_salt(Some("y")),
            CacheScope::deployment().with_salt(Some("x")),
        ];
        for (i, a) in scopes.iter().enumerate() {
            for b in &scopes[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.key(), b.key(), "{a:?} and {b:?}");
            }
        }
        assert_eq!(
            CacheScope::tenant("a").key(),
            CacheScope::tenant("a").with_salt(None).key()
        );
        assert_eq!(CacheScope::shared("t").label(), "shared:t");
        assert_eq!(
            CacheScope::deployment().with_salt(Some("s")).label(),
            "deployment"
        );
    }
}
