//! What each cache scope holds of the prompt cache and how often its lookups hit,
//! kept for the admin API (`GET /admin/cache`, issue 37). The executor thread
//! writes it; an admin request reads a copy.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::kv::ScopeUsage;

/// One scope owner's use of the prompt cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeCacheUse {
    /// `deployment`, `tenant:<name>` or `shared:<name>` (salts left out).
    pub scope: String,
    /// Blocks (and tails) it holds now.
    pub blocks: usize,
    /// Bytes of the KV budget they take.
    pub bytes: usize,
    /// Prompt tokens of its admitted requests read from the cache.
    pub hit_tokens: u64,
    /// Prompt tokens of its admitted requests computed.
    pub miss_tokens: u64,
}

/// Every scope owner seen since the server started, by label.
#[derive(Debug, Default)]
pub(super) struct CacheUse {
    scopes: Mutex<BTreeMap<String, ScopeCacheUse>>,
}

impl CacheUse {
    fn entry<'a>(
        scopes: &'a mut BTreeMap<String, ScopeCacheUse>,
        scope: &str,
    ) -> &'a mut ScopeCacheUse {
        scopes
            .entry(scope.to_owned())
            .or_insert_with(|| ScopeCacheUse {
                scope: scope.to_owned(),
                ..ScopeCacheUse::default()
            })
    }

    /// A request of `scope` was admitted with `cached` prompt tokens from the
    /// cache and `computed` to run.
    pub(super) fn count(&self, scope: &str, cached: usize, computed: usize) {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = Self::entry(&mut scopes, scope);
        entry.hit_tokens = entry.hit_tokens.saturating_add(cached as u64);
        entry.miss_tokens = entry.miss_tokens.saturating_add(computed as u64);
    }

    /// What every scope holds now (`held` lists each scope holding a block).
    pub(super) fn set_held(&self, held: &[ScopeUsage]) {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in scopes.values_mut() {
            entry.blocks = 0;
            entry.bytes = 0;
        }
        for usage in held {
            let entry = Self::entry(&mut scopes, &usage.scope);
            entry.blocks = usage.blocks;
            entry.bytes = usage.bytes;
        }
    }

    /// Every scope owner, by label.
    pub(super) fn snapshot(&self) -> Vec<ScopeCacheUse> {
        let scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_accumulate_and_holdings_follow_the_cache() {
        let cache = CacheUse::default();
        cache.count("tenant:a", 0, 40);
        cache.count("tenant:a", 32, 8);
        let held = |scope: &str, blocks| ScopeUsage {
            scope: scope.to_owned(),
            blocks,
            bytes: blocks * 100,
        };
        cache.set_held(&[held("tenant:a", 2), held("tenant:b", 1)]);
        cache.set_held(&[held("tenant:b", 3)]);
        let snapshot = cache.snapshot();
        assert_eq!(
            snapshot,
            vec![
                ScopeCacheUse {
                    scope: "tenant:a".into(),
                    blocks: 0,
                    bytes: 0,
                    hit_tokens: 32,
                    miss_tokens: 48,
                },
                ScopeCacheUse {
                    scope: "tenant:b".into(),
                    blocks: 3,
                    bytes: 300,
                    hit_tokens: 0,
                    miss_tokens: 0,
                },
            ]
        );
    }
}
