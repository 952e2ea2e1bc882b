//! Compiled grammars kept by the hash of their source, per checkpoint.
//!
//! A request fans out into `n` × prompts sequences with one schema, and
//! clients send the same schema request after request; a 5,000-property
//! schema takes half a second to compile. Each sequence gets a deep clone of
//! the compiled matcher (its own parser state, no lexer cache shared across
//! threads). Failures are kept too, so a schema the grammar engine refuses
//! costs one compile, not one per retry. Bounded: the oldest entry goes first.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use switchyard_seam::BackendError;

/// Compiled grammars kept per checkpoint.
const CAPACITY: usize = 32;

/// A compile's outcome, as kept.
pub type Compiled = Result<Matcher, BackendError>;

/// The cache. Keys are hashed with a per-process random key, so a client
/// cannot craft two schemas that collide.
#[derive(Default)]
pub struct GrammarCache {
    hasher: RandomState,
    /// Lock held only to look up, clone or insert; never while compiling.
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<u64, Compiled>,
    /// Insertion order, oldest first.
    order: VecDeque<u64>,
}

impl std::fmt::Debug for GrammarCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.entries.lock().map_or(0, |e| e.map.len());
        f.debug_struct("GrammarCache").field("len", &len).finish()
    }
}

impl GrammarCache {
    /// The key of `grammar` (a hash of its serialized form).
    pub fn key(&self, grammar: &TopLevelGrammar) -> u64 {
        let text = serde_json::to_string(grammar).unwrap_or_default();
        self.hasher.hash_one(text)
    }

    /// A fresh copy of the grammar compiled under `key`, if kept.
    pub fn get(&self, key: u64) -> Option<Compiled> {
        let entries = self.entries.lock().ok()?;
        entries.map.get(&key).map(|compiled| match compiled {
            Ok(matcher) => Ok(matcher.deep_clone()),
            Err(error) => Err(error.clone()),
        })
    }

    /// Keeps `compiled` under `key`, dropping the oldest entry when full.
    pub fn insert(&self, key: u64, compiled: &Compiled) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let kept = match compiled {
            Ok(matcher) => Ok(matcher.deep_clone()),
            Err(error) => Err(error.clone()),
        };
        if entries.map.insert(key, kept).is_none() {
            entries.order.push_back(key);
        }
        while entries.order.len() > CAPACITY {
            if let Some(oldest) = entries.order.pop_front() {
                entries.map.remove(&oldest);
            }
        }
    }

    /// Grammars kept.
    pub fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.map.len())
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(i: usize) -> Compiled {
        Err(BackendError::invalid("f", format!("error {i}")))
    }

    #[test]
    fn keeps_at_most_capacity_oldest_out_first() {
        let cache = GrammarCache::default();
        for i in 0..CAPACITY + 5 {
            cache.insert(i as u64, &refused(i));
        }
        assert_eq!(cache.len(), CAPACITY);
        assert!(cache.get(0).is_none());
        assert!(cache.get(4).is_none());
        assert_eq!(
            cache.get(5).map(|c| c.err()),
            Some(Some(BackendError::invalid("f", "error 5")))
        );
    }

    #[test]
    fn the_same_grammar_has_the_same_key() {
        let cache = GrammarCache::default();
        let a = TopLevelGrammar::from_lark("start: \"a\"".to_owned());
        let b = TopLevelGrammar::from_lark("start: \"b\"".to_owned());
        assert_eq!(cache.key(&a), cache.key(&a.clone()));
        assert_ne!(cache.key(&a), cache.key(&b));
    }
}
