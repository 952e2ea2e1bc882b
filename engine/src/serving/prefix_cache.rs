//! The prompt cache: full KV blocks of prompt prefixes kept after their
//! sequence ends, reused by later requests whose prompts start the same.
//!
//! - A block is found by a chained hash: block `i`'s hash covers block
//!   `i - 1`'s hash and block `i`'s token ids, so one hash names the whole
//!   prefix up to the block's end. The entry keeps its tokens and its
//!   parent's hash too, and a lookup compares them: a hash collision
//!   misses, it never serves another prompt's KV.
//! - Entries are keyed by the checkpoint's weight identity (see
//!   `LlamaModel::weight_identity`), not its name: two versions with the
//!   same weights share blocks, a reload with other weights never does.
//!   Each identity remembers the checkpoints holding it (weakly); once
//!   none is loaded, its blocks go ([`PrefixCache::purge_unloaded`]).
//! - A block shared by running sequences has more than one holder (the
//!   backend's handle count): it cannot be evicted. The others are evicted
//!   least recently used first, deepest first among equals (a child is
//!   useless without its parent), when the KV budget needs their bytes.
//!
//! Only full blocks are cached; a prompt's partial tail block stays the
//! sequence's own.

use std::any::Any;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Weak;

use switchyard_kernels::SharedKvBlock;

/// The chained hash of one full block of a prompt.
pub(super) type BlockHash = u64;

/// What [`PrefixCache::insert`] asks for a block: its shared handle, or
/// `None` when it cannot be had (the budget, a backend refusal).
pub(super) type ShareBlock<'a, T> = dyn FnMut(usize, &mut PrefixCache<T>) -> Option<T> + 'a;

/// The hash of a chain with no block yet.
const ROOT: BlockHash = 0;

/// The chained hashes of the full blocks of `tokens`, `positions` tokens each.
pub(super) fn block_hashes(tokens: &[u32], positions: usize) -> Vec<BlockHash> {
    let mut parent = ROOT;
    tokens
        .chunks_exact(positions.max(1))
        .map(|block| {
            let mut hasher = DefaultHasher::new();
            parent.hash(&mut hasher);
            block.hash(&mut hasher);
            parent = hasher.finish();
            parent
        })
        .collect()
}

struct Entry<T> {
    block: T,
    parent: BlockHash,
    tokens: Box<[u32]>,
    /// Its index in the prompt: among entries used at the same time, the
    /// deepest goes first.
    depth: usize,
    /// The cache's clock when a lookup last used it.
    last_used: u64,
}

/// Full prompt blocks by weight identity and chained hash.
pub(super) struct PrefixCache<T> {
    positions: usize,
    entries: HashMap<(u64, BlockHash), Entry<T>>,
    /// Per weight identity, the checkpoints holding it.
    owners: HashMap<u64, Vec<Weak<dyn Any + Send + Sync>>>,
    clock: u64,
    /// Blocks evicted under budget pressure since the last
    /// [`PrefixCache::take_evicted`].
    evicted: usize,
    /// While an insert runs, its clock: the blocks it has just added are
    /// not evicted to make room for the rest of their own chain.
    inserting: Option<u64>,
}

impl<T: SharedKvBlock> PrefixCache<T> {
    /// A cache of blocks of `positions` tokens.
    pub(super) fn new(positions: usize) -> Self {
        PrefixCache {
            positions: positions.max(1),
            entries: HashMap::new(),
            owners: HashMap::new(),
            clock: 0,
            evicted: 0,
            inserting: None,
        }
    }

    /// Blocks held.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of the KV budget the held blocks take.
    pub(super) fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.block.bytes()).sum()
    }

    /// Notes that `owner` (a loaded checkpoint) has weight identity `weights`.
    pub(super) fn register(&mut self, weights: u64, owner: Weak<dyn Any + Send + Sync>) {
        let owners = self.owners.entry(weights).or_default();
        if !owners.iter().any(|o| o.ptr_eq(&owner)) {
            owners.push(owner);
        }
    }

    /// Drops the blocks of every weight identity no loaded checkpoint
    /// holds any more (its versions were unloaded); returns how many.
    pub(super) fn purge_unloaded(&mut self) -> usize {
        let weights_before = self.owners.len();
        self.owners.retain(|_, owners| {
            owners.retain(|o| o.strong_count() > 0);
            !owners.is_empty()
        });
        // The scheduler calls this every step: scan the blocks only when
        // some weights lost their last version.
        if self.owners.len() == weights_before {
            return 0;
        }
        let before = self.entries.len();
        let owners = &self.owners;
        self.entries
            .retain(|(weights, _), _| owners.contains_key(weights));
        before - self.entries.len()
    }

    /// The cached blocks that start `prompt` on `weights`, in order, at
    /// most enough to leave the prompt's last token to compute (its logits
    /// pick the first output token). Marks them used.
    pub(super) fn lookup(&mut self, weights: u64, prompt: &[u32]) -> Vec<T> {
        let usable = prompt.len().saturating_sub(1) / self.positions;
        let hashes = block_hashes(&prompt[..usable * self.positions], self.positions);
        self.clock += 1;
        let mut found = Vec::new();
        let mut parent = ROOT;
        for ((hash, tokens), depth) in hashes
            .iter()
            .zip(prompt.chunks_exact(self.positions))
            .zip(0..)
        {
            let Some(entry) = self.entries.get_mut(&(weights, *hash)) else {
                break;
            };
            if entry.parent != parent || *entry.tokens != *tokens || entry.depth != depth {
                break;
            }
            entry.last_used = self.clock;
            found.push(entry.block.clone());
            parent = *hash;
        }
        found
    }

    /// Caches the full blocks of `prompt` from block `from` on that are
    /// not cached yet, asking `share` for each (it may evict through the
    /// cache it is given to make room); stops at the first it cannot have.
    /// Returns how many it added.
    pub(super) fn insert(
        &mut self,
        weights: u64,
        prompt: &[u32],
        from: usize,
        share: &mut ShareBlock<'_, T>,
    ) -> usize {
        let hashes = block_hashes(prompt, self.positions);
        self.clock += 1;
        self.inserting = Some(self.clock);
        let mut added = 0;
        for (depth, hash) in hashes.iter().enumerate().skip(from) {
            let key = (weights, *hash);
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.last_used = self.clock;
                continue;
            }
            let Some(block) = share(depth, self) else {
                break;
            };
            let start = depth * self.positions;
            let tokens = prompt
                .get(start..start + self.positions)
                .unwrap_or_default()
                .into();
            let parent = depth
                .checked_sub(1)
                .and_then(|p| hashes.get(p).copied())
                .unwrap_or(ROOT);
            self.entries.insert(
                key,
                Entry {
                    block,
                    parent,
                    tokens,
                    depth,
                    last_used: self.clock,
                },
            );
            added += 1;
        }
        self.inserting = None;
        added
    }

    /// Evicts unshared blocks, least recently used first, until `bytes`
    /// are freed or none is left; returns the bytes freed.
    pub(super) fn evict(&mut self, bytes: usize) -> usize {
        let mut candidates: Vec<((u64, BlockHash), u64, usize)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.block.holders() == 1 && Some(e.last_used) != self.inserting)
            .map(|(key, e)| (*key, e.last_used, e.depth))
            .collect();
        candidates.sort_by_key(|&(_, used, depth)| (used, std::cmp::Reverse(depth)));
        let mut freed = 0;
        for (key, _, _) in candidates {
            if freed >= bytes {
                break;
            }
            if let Some(entry) = self.entries.remove(&key) {
                freed += entry.block.bytes();
                self.evicted += 1;
            }
        }
        freed
    }

    /// Blocks evicted under pressure since the last call.
    pub(super) fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A block handle whose holders are its `Arc`'s.
    #[derive(Clone, Debug)]
    struct FakeBlock(Arc<usize>);

    impl SharedKvBlock for FakeBlock {
        fn holders(&self) -> usize {
            Arc::strong_count(&self.0)
        }

        fn bytes(&self) -> usize {
            100
        }
    }

    fn share_all() -> impl FnMut(usize, &mut PrefixCache<FakeBlock>) -> Option<FakeBlock> {
        |depth, _| Some(FakeBlock(Arc::new(depth)))
    }

    fn cache_with_owner() -> (PrefixCache<FakeBlock>, Arc<u8>) {
        let mut cache = PrefixCache::new(4);
        let owner = Arc::new(0u8);
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&owner) as _;
        cache.register(7, weak);
        (cache, owner)
    }

    #[test]
    fn hashes_chain_so_equal_blocks_after_different_prefixes_differ() {
        let a = block_hashes(&[1, 2, 3, 4, 9, 9, 9, 9, 5], 4);
        let b = block_hashes(&[0, 2, 3, 4, 9, 9, 9, 9], 4);
        assert_eq!(a.len(), 2, "the partial tail is not a block");
        assert_ne!(a[1], b[1]);
        assert_eq!(a, block_hashes(&[1, 2, 3, 4, 9, 9, 9, 9], 4));
    }

    #[test]
    fn a_lookup_finds_the_longest_cached_prefix_and_leaves_the_last_token() {
        let (mut cache, _owner) = cache_with_owner();
        let prompt: Vec<u32> = (0..12).collect();
        assert_eq!(cache.insert(7, &prompt, 0, &mut share_all()), 3);
        // A prompt of exactly the cached 12 tokens recomputes its last block.
        assert_eq!(cache.lookup(7, &prompt).len(), 2);
        let mut longer = prompt.clone();
        longer.push(99);
        let found = cache.lookup(7, &longer);
        assert_eq!(found.iter().map(|b| *b.0).collect::<Vec<_>>(), [0, 1, 2]);
        // Another second block: only the first matches.
        let mut other = prompt.clone();
        other[5] = 42;
        assert_eq!(cache.lookup(7, &other).len(), 1);
        // Other weights: nothing.
        assert!(cache.lookup(8, &longer).is_empty());
        // Inserting again adds nothing.
        assert_eq!(cache.insert(7, &prompt, 0, &mut share_all()), 0);
    }

    #[test]
    fn eviction_takes_unshared_blocks_least_recently_used_and_deepest_first() {
        let (mut cache, _owner) = cache_with_owner();
        let old: Vec<u32> = (100..108).collect();
        let new: Vec<u32> = (200..208).collect();
        cache.insert(7, &old, 0, &mut share_all());
        cache.insert(7, &new, 0, &mut share_all());
        // A running sequence holds the old prompt's first block.
        let held = cache.lookup(7, &[100, 101, 102, 103, 0]);
        assert_eq!(held.len(), 1);
        assert_eq!(cache.evict(100), 100);
        assert_eq!(cache.take_evicted(), 1);
        // The old prompt's second block went (its first is held).
        let mut probe = old.clone();
        probe.push(0);
        assert_eq!(cache.lookup(7, &probe).len(), 1);
        // Then the new prompt's, deepest first; the held block never.
        assert_eq!(cache.evict(1000), 200);
        assert_eq!(cache.len(), 1);
        drop(held);
        assert_eq!(cache.evict(1000), 100);
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.take_evicted(), 3);
    }

    #[test]
    fn an_insert_short_of_budget_evicts_older_blocks_not_its_own_chain() {
        let (mut cache, _owner) = cache_with_owner();
        cache.insert(7, &(100..104).collect::<Vec<u32>>(), 0, &mut share_all());
        let prompt: Vec<u32> = (0..12).collect();
        let mut freed = Vec::new();
        let mut tight = |depth: usize, cache: &mut PrefixCache<FakeBlock>| {
            // Every share past the first needs one block's room.
            if depth > 0 {
                freed.push(cache.evict(100));
            }
            Some(FakeBlock(Arc::new(depth)))
        };
        assert_eq!(cache.insert(7, &prompt, 0, &mut tight), 3);
        // The old block went first; then nothing of the new chain.
        assert_eq!(freed, [100, 0]);
        assert_eq!(cache.lookup(7, &(0..13).collect::<Vec<u32>>()).len(), 3);
    }

    #[test]
    fn a_failed_share_stops_the_insert_at_that_block() {
        let (mut cache, _owner) = cache_with_owner();
        let prompt: Vec<u32> = (0..12).collect();
        let mut refuse_second = |depth: usize, _: &mut PrefixCache<FakeBlock>| {
            (depth != 1).then(|| FakeBlock(Arc::new(depth)))
        };
        assert_eq!(cache.insert(7, &prompt, 0, &mut refuse_second), 1);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn blocks_go_when_no_checkpoint_with_their_weights_is_loaded() {
        let (mut cache, owner) = cache_with_owner();
        let twin = Arc::new(1u8);
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&twin) as _;
        cache.register(7, weak);
        cache.insert(7, &(0..8).collect::<Vec<u32>>(), 0, &mut share_all());
        drop(owner);
        assert_eq!(
            cache.purge_unloaded(),
            0,
            "a version with the same weights remains"
        );
        drop(twin);
        assert_eq!(cache.purge_unloaded(), 2);
        assert_eq!(cache.len(), 0);
    }
}
