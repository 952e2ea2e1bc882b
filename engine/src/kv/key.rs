//! What besides its tokens decides a KV block's contents: the prompt
//! cache's hash chain starts from it, so blocks of different keys never
//! meet.

use std::hash::{Hash, Hasher};

/// Everything besides the tokens that changes the keys and values a
/// sequence writes. The prompt cache shares a block only between
/// sequences of equal keys; a new input to the KV (a tenant's cache
/// scope, say) is one more field here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The checkpoint's weight identity (`LlamaModel::weight_identity`):
    /// equal weights share blocks whatever their versions' names.
    pub weights: u64,
    /// The adapter applied over the weights, if any.
    pub adapter: Option<u64>,
    /// The cache scope's key (`CacheScope::key`): blocks of one tenant's
    /// scope are never found by a request of another.
    pub scope: u64,
}

impl CacheKey {
    /// The key of sequences on `weights` without an adapter.
    pub fn weights(weights: u64) -> CacheKey {
        CacheKey {
            weights,
            adapter: None,
            scope: 0,
        }
    }

    /// This key within `scope`.
    pub fn with_scope(self, scope: &switchyard_seam::CacheScope) -> CacheKey {
        CacheKey {
            scope: scope.key(),
            ..self
        }
    }

    /// The hash a chain of blocks under this key starts from.
    pub(crate) fn root(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_changes_the_root() {
        let base = CacheKey::weights(7);
        let adapted = CacheKey {
            adapter: Some(1),
            ..base
        };
        assert_ne!(base.root(), CacheKey::weights(8).root());
        assert_ne!(base.root(), adapted.root());
        let scoped = base.with_scope(&switchyard_seam::CacheScope::tenant("a"));
        assert_ne!(base.root(), scoped.root());
        assert_eq!(base.root(), CacheKey::weights(7).root());
    }
}
