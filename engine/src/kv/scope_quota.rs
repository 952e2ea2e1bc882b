//! Each scope's quota of the prompt cache: the order in which cached blocks are
//! evicted so that one tenant's traffic cannot evict every other tenant's prefixes.
//!
//! Each eviction shares the bytes the cache is to keep among the scope owners holding
//! blocks, max-min fair: an owner holding less than an equal share keeps all of it,
//! and the others get equal quotas of the rest (salted scopes count toward their
//! owner, so salts do not buy a tenant more room). Blocks of owners over their quota
//! go first, least recently used first, deepest first among equals, until each is
//! down to its quota; only then do the others go, in the same order. So a tenant
//! whose prompts fill the cache evicts its own blocks, and a light tenant keeps up to
//! its share however busy the heavy one is.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::Hash;

/// One evictable block as the quota sees it.
pub(crate) struct Candidate<K, O> {
    pub(crate) key: K,
    pub(crate) owner: O,
    pub(crate) bytes: usize,
    pub(crate) last_used: u64,
    pub(crate) depth: usize,
}

/// The keys of `candidates` in the order they are to be evicted to free `need`
/// bytes, given the bytes each owner holds now (`held`, evictable or not).
pub(crate) fn eviction_order<K, O: Eq + Hash>(
    mut candidates: Vec<Candidate<K, O>>,
    mut held: HashMap<O, usize>,
    need: usize,
) -> Vec<K> {
    candidates.sort_by_key(|c| (c.last_used, Reverse(c.depth)));
    let quota = quota(held.values().copied().collect(), need);
    let mut first = Vec::with_capacity(candidates.len());
    let mut rest = Vec::new();
    for candidate in candidates {
        match held.get_mut(&candidate.owner) {
            Some(bytes) if *bytes > quota => {
                *bytes = bytes.saturating_sub(candidate.bytes);
                first.push(candidate.key);
            }
            _ => rest.push(candidate.key),
        }
    }
    first.extend(rest);
    first
}

/// The level each owner is cut down to when the cache, holding `held` per owner,
/// frees `need` bytes: the largest `q` with the sum of `min(held, q)` at most what
/// is kept (water-filling).
fn quota(mut held: Vec<usize>, need: usize) -> usize {
    held.sort_unstable();
    let mut keep = held.iter().sum::<usize>().saturating_sub(need);
    let owners = held.len();
    for (i, bytes) in held.into_iter().enumerate() {
        let level = keep / (owners - i);
        if bytes > level {
            return level;
        }
        keep -= bytes;
    }
    usize::MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(key: u32, owner: &'static str, last_used: u64) -> Candidate<u32, &'static str> {
        Candidate {
            key,
            owner,
            bytes: 100,
            last_used,
            depth: 0,
        }
    }

    #[test]
    fn owners_over_their_share_lose_blocks_first_then_least_recently_used() {
        // Heavy holds 4 blocks, light 1 (the oldest of all).
        let candidates = vec![
            block(0, "light", 1),
            block(1, "heavy", 2),
            block(2, "heavy", 3),
            block(3, "heavy", 4),
            block(4, "heavy", 5),
        ];
        let held = HashMap::from([("light", 100), ("heavy", 400)]);
        // Keeping 300 of 500: light keeps its 100, heavy's quota is 200, so its
        // two oldest go first; then least recently used.
        assert_eq!(eviction_order(candidates, held, 200), [1, 2, 0, 3, 4]);
    }

    #[test]
    fn with_one_owner_the_order_is_least_recently_used_deepest_first() {
        let mut deep = block(7, "a", 1);
        deep.depth = 3;
        let candidates = vec![block(5, "a", 2), block(6, "a", 1), deep];
        let held = HashMap::from([("a", 300)]);
        assert_eq!(eviction_order(candidates, held, 100), [7, 6, 5]);
    }

    #[test]
    fn quotas_fill_small_owners_first_and_share_the_rest_equally() {
        assert_eq!(quota(vec![100, 400], 200), 200);
        assert_eq!(quota(vec![100, 400, 500], 400), 250);
        assert_eq!(quota(vec![200, 200], 100), 150);
        assert_eq!(quota(vec![300], 0), usize::MAX);
        assert_eq!(quota(vec![300], 500), 0);
    }
}
