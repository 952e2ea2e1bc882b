//! The prompt cache: KV blocks of prompt prefixes kept after their
//! sequence ends, reused by later requests whose prompts start the same.
//!
//! - A full block is found by a chained hash: block `i`'s hash covers
//!   block `i - 1`'s hash and block `i`'s token ids, and block 0's the
//!   [`CacheKey`] (the weights, an adapter), so one hash names the whole
//!   prefix up to the block's end and what computed it. The entry keeps its tokens and its
//!   parent's hash too, and a lookup compares them: a hash collision
//!   misses, it never serves another prompt's KV.
//! - A prompt's partial last block is kept as a **tail**: its written
//!   positions in whole units of `KV_UNIT` positions, copied into
//!   a block of their own, under the same parent. A lookup goes on past
//!   the last full block it found with the child of that block (a tail or
//!   a full block) that shares the most of the prompt's next tokens, and
//!   the new cache copies that many positions of it. With blocks of 1,024
//!   positions, a system prompt of 1,500 tokens would otherwise reuse only
//!   its first 1,024.
//! - Entries are keyed by their [`CacheKey`], whose weights are the
//!   checkpoint's weight identity (see `LlamaModel::weight_identity`),
//!   not its name: two versions with the
//!   same weights share blocks, a reload with other weights never does.
//!   Each identity remembers the checkpoints holding it (weakly); once
//!   none is loaded, its blocks go ([`PrefixCache::purge_unloaded`]).
//! - A block shared by running sequences has more than one holder (the
//!   handle count of [`CachedBlock`]): it cannot be evicted. The others are evicted
//!   least recently used first, deepest first among equals (a child is
//!   useless without its parent), when the KV budget needs their bytes.

use std::any::Any;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Weak;

use switchyard_kernels::KvPrefix;

use super::block::CachedBlock;
use super::key::CacheKey;
use super::scope_quota::{eviction_order, Candidate};
use switchyard_seam::{CacheScope, ScopeOwner};

/// The chained hash of one block (or tail) of a prompt.
pub(crate) type BlockHash = u64;

/// What [`PrefixCache::insert`] asks for the prompt positions `range`: a
/// full block's shared handle, or (a shorter range from a block's start)
/// a tail's copy; `None` when it cannot be had (the budget, a backend
/// refusal).
pub(crate) type ShareBlock<'a, T> = dyn FnMut(Range<usize>, &mut PrefixCache<T>) -> Option<T> + 'a;

/// Tails kept under one parent: prompts that share a prefix and then
/// differ (one system prompt, many user messages) each leave one.
const MAX_TAILS: usize = 8;

/// The hash of `tokens` after the block (or root) `parent`.
fn chain(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// The chained hashes of the full blocks of `tokens` under `key`,
/// `positions` tokens each.
pub(crate) fn block_hashes(key: &CacheKey, tokens: &[u32], positions: usize) -> Vec<BlockHash> {
    let mut parent = key.root();
    tokens
        .chunks_exact(positions.max(1))
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

/// What the cache holds for one scope owner (salted scopes count toward
/// their owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeUsage {
    /// [`CacheScope::label`]: `deployment`, `tenant:<name>` or `shared:<name>`.
    pub scope: String,
    /// Blocks (and tails) held.
    pub blocks: usize,
    /// Bytes of the KV budget they take.
    pub bytes: usize,
}

/// What a lookup found: the full blocks that start the prompt, then the
/// block whose first `tail.1` positions go on with it.
pub(crate) struct Found<T> {
    pub(crate) shared: Vec<T>,
    pub(crate) tail: Option<(T, usize)>,
}

impl<T> Found<T> {
    /// Nothing cached.
    pub(crate) fn none() -> Self {
        Found {
            shared: Vec::new(),
            tail: None,
        }
    }

    /// What the new cache starts from.
    pub(crate) fn prefix(&self) -> KvPrefix<'_, T> {
        KvPrefix {
            shared: &self.shared,
            tail: self.tail.as_ref().map(|(block, n)| (block, *n)),
        }
    }
}

struct Entry<T> {
    block: T,
    /// Who may find it (its key holds the scope's hash too; this is for
    /// use per scope and the scopes' eviction quotas).
    scope: CacheScope,
    parent: BlockHash,
    /// A full block's tokens, or fewer: a tail's.
    tokens: Box<[u32]>,
    /// Its index in the prompt: among entries used at the same time, the
    /// deepest goes first.
    depth: usize,
    /// The cache's clock when a lookup last used it.
    last_used: u64,
}

impl<T: CachedBlock> Entry<T> {
    /// Whether only the cache holds its block (no sequence reads it).
    fn unread(&self) -> bool {
        self.block.holders() == 1
    }
}

/// Prompt blocks and tails by key and chained hash.
pub(crate) struct PrefixCache<T> {
    positions: usize,
    /// Positions a tail is a multiple of.
    unit: usize,
    entries: HashMap<(CacheKey, BlockHash), Entry<T>>,
    /// Per key and parent, the hashes of its children (full
    /// blocks and tails).
    children: HashMap<(CacheKey, BlockHash), Vec<BlockHash>>,
    /// Per weight identity, the checkpoints holding it.
    owners: HashMap<u64, Vec<Weak<dyn Any + Send + Sync>>>,
    clock: u64,
    /// Blocks evicted under budget pressure, or tails past
    /// [`MAX_TAILS`], since the last [`PrefixCache::take_evicted`].
    evicted: usize,
    /// While an insert runs, its clock: the blocks it has just added are
    /// not evicted to make room for the rest of their own chain.
    inserting: Option<u64>,
}

impl<T: CachedBlock> PrefixCache<T> {
    /// A cache of blocks of `positions` tokens and tails of multiples of
    /// `unit`.
    pub(crate) fn new(positions: usize, unit: usize) -> Self {
        PrefixCache {
            positions: positions.max(1),
            unit: unit.clamp(1, positions.max(1)),
            entries: HashMap::new(),
            children: HashMap::new(),
            owners: HashMap::new(),
            clock: 0,
            evicted: 0,
            inserting: None,
        }
    }

    /// Blocks held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of the KV budget the held blocks take.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.block.bytes()).sum()
    }

    /// Bytes of the KV budget held by blocks no sequence reads: what
    /// [`PrefixCache::evict`] can free, so admission counts them as free
    /// (and the KV-cache use gauge as unused).
    pub(crate) fn unread_bytes(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.unread())
            .map(|e| e.block.bytes())
            .sum()
    }

    /// Blocks and bytes held per scope owner ([`CacheScope::label`]), in
    /// label order.
    pub(crate) fn usage_by_scope(&self) -> Vec<ScopeUsage> {
        let mut by_label: BTreeMap<String, ScopeUsage> = BTreeMap::new();
        for entry in self.entries.values() {
            let label = entry.scope.label();
            let usage = by_label.entry(label.clone()).or_insert(ScopeUsage {
                scope: label,
                blocks: 0,
                bytes: 0,
            });
            usage.blocks += 1;
            usage.bytes += entry.block.bytes();
        }
        by_label.into_values().collect()
    }

    /// Notes that `owner` (a loaded checkpoint) has weight identity `weights`.
    pub(crate) fn register(&mut self, weights: u64, owner: Weak<dyn Any + Send + Sync>) {
        let owners = self.owners.entry(weights).or_default();
        if !owners.iter().any(|o| o.ptr_eq(&owner)) {
            owners.push(owner);
        }
    }

    /// Drops the blocks of every weight identity no loaded checkpoint
    /// holds any more (its versions were unloaded); returns how many.
    pub(crate) fn purge_unloaded(&mut self) -> usize {
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
            .retain(|(key, _), _| owners.contains_key(&key.weights));
        self.children
            .retain(|(key, _), _| owners.contains_key(&key.weights));
        before - self.entries.len()
    }

    /// Adds a child of `entry.parent`; the tails there whose tokens it
    /// starts with go (it serves whatever they did).
    fn add(&mut self, key: CacheKey, hash: BlockHash, entry: Entry<T>) {
        let parent = entry.parent;
        let covered: Vec<BlockHash> = self
            .children
            .get(&(key, parent))
            .into_iter()
            .flatten()
            .filter(|kid| {
                self.entries.get(&(key, **kid)).is_some_and(|e| {
                    e.tokens.len() < entry.tokens.len() && entry.tokens.starts_with(&e.tokens)
                })
            })
            .copied()
            .collect();
        for kid in covered {
            self.remove((key, kid));
        }
        if self.entries.insert((key, hash), entry).is_none() {
            self.children.entry((key, parent)).or_default().push(hash);
        }
    }

    fn remove(&mut self, key: (CacheKey, BlockHash)) -> Option<Entry<T>> {
        let entry = self.entries.remove(&key)?;
        if let Some(kids) = self.children.get_mut(&(key.0, entry.parent)) {
            kids.retain(|k| *k != key.1);
            if kids.is_empty() {
                self.children.remove(&(key.0, entry.parent));
            }
        }
        Some(entry)
    }

    /// The child of `parent` at `depth` that shares the most whole units
    /// of `rest` (at least one): its hash and that many positions.
    fn best_child(
        &self,
        key: CacheKey,
        parent: BlockHash,
        depth: usize,
        rest: &[u32],
    ) -> Option<(BlockHash, usize)> {
        let kids = self.children.get(&(key, parent))?;
        kids.iter()
            .filter_map(|hash| {
                let entry = self.entries.get(&(key, *hash))?;
                if entry.parent != parent || entry.depth != depth {
                    return None;
                }
                let common = entry.tokens.iter().zip(rest).take_while(|(a, b)| a == b);
                let n = common.count() / self.unit * self.unit;
                (n > 0).then_some((*hash, n))
            })
            .max_by_key(|&(_, n)| n)
    }

    /// The cached blocks that start `prompt` under `key`, in order, then
    /// the tail (or block) that goes on furthest with it, at most enough
    /// to leave the prompt's last token to compute (its logits pick the
    /// first output token). Marks them used.
    pub(crate) fn lookup(&mut self, key: CacheKey, scope: &CacheScope, prompt: &[u32]) -> Found<T> {
        let key = key.with_scope(scope);
        let usable = prompt.len().saturating_sub(1);
        let full = usable / self.positions;
        let hashes = block_hashes(&key, &prompt[..full * self.positions], self.positions);
        self.clock += 1;
        let mut found = Found::none();
        let mut parent = key.root();
        for ((hash, tokens), depth) in hashes
            .iter()
            .zip(prompt.chunks_exact(self.positions))
            .zip(0..)
        {
            let Some(entry) = self.entries.get_mut(&(key, *hash)) else {
                break;
            };
            if entry.parent != parent || *entry.tokens != *tokens || entry.depth != depth {
                break;
            }
            entry.last_used = self.clock;
            found.shared.push(entry.block.clone());
            parent = *hash;
        }
        let depth = found.shared.len();
        let rest = prompt
            .get(depth * self.positions..usable)
            .unwrap_or_default();
        if let Some((hash, n)) = self.best_child(key, parent, depth, rest) {
            if let Some(entry) = self.entries.get_mut(&(key, hash)) {
                entry.last_used = self.clock;
                found.tail = Some((entry.block.clone(), n));
            }
        }
        found
    }

    /// Caches the full blocks of `prompt` from block `from` on that are
    /// not cached yet, then its tail, asking `share` for each (it may
    /// evict through the cache it is given to make room); stops at the
    /// first it cannot have. Returns how many it added.
    pub(crate) fn insert(
        &mut self,
        key: CacheKey,
        scope: &CacheScope,
        prompt: &[u32],
        from: usize,
        share: &mut ShareBlock<'_, T>,
    ) -> usize {
        let key = key.with_scope(scope);
        let hashes = block_hashes(&key, prompt, self.positions);
        self.clock += 1;
        self.inserting = Some(self.clock);
        let mut added = 0;
        let mut parent = from
            .checked_sub(1)
            .and_then(|last| hashes.get(last).copied())
            .unwrap_or_else(|| key.root());
        for (depth, hash) in hashes.iter().enumerate().skip(from) {
            let start = depth * self.positions;
            let tokens = prompt
                .get(start..start + self.positions)
                .unwrap_or_default();
            if let Some(entry) = self.entries.get_mut(&(key, *hash)) {
                entry.last_used = self.clock;
                parent = *hash;
                continue;
            }
            let Some(block) = share(start..start + self.positions, self) else {
                self.inserting = None;
                return added;
            };
            let entry = self.entry(block, scope, parent, tokens, depth);
            self.add(key, *hash, entry);
            parent = *hash;
            added += 1;
        }
        added += self.insert_tail(key, scope, prompt, parent, hashes.len(), share);
        self.inserting = None;
        added
    }

    /// Caches the tail of `prompt` after its `depth` full blocks (the last
    /// one `parent`), unless a child there already covers it; a shorter
    /// tail it extends goes. Returns how many it added (0 or 1).
    fn insert_tail(
        &mut self,
        key: CacheKey,
        scope: &CacheScope,
        prompt: &[u32],
        parent: BlockHash,
        depth: usize,
        share: &mut ShareBlock<'_, T>,
    ) -> usize {
        let start = depth * self.positions;
        let rest = prompt.get(start..).unwrap_or_default();
        let tokens = &rest[..rest.len() / self.unit * self.unit];
        if tokens.is_empty() {
            return 0;
        }
        if let Some((hash, n)) = self.best_child(key, parent, depth, tokens) {
            if n == tokens.len() {
                if let Some(entry) = self.entries.get_mut(&(key, hash)) {
                    entry.last_used = self.clock;
                }
                return 0;
            }
        }
        let Some(block) = share(start..start + tokens.len(), self) else {
            return 0;
        };
        let hash = chain(parent, tokens);
        let entry = self.entry(block, scope, parent, tokens, depth);
        self.add(key, hash, entry);
        // Past the cap, the least recently used of the others go.
        let mut others: Vec<(BlockHash, u64)> = self
            .children
            .get(&(key, parent))
            .into_iter()
            .flatten()
            .filter(|kid| **kid != hash)
            .filter_map(|kid| {
                let entry = self.entries.get(&(key, *kid))?;
                (entry.tokens.len() < self.positions).then_some((*kid, entry.last_used))
            })
            .collect();
        others.sort_by_key(|&(_, used)| used);
        let over = (others.len() + 1).saturating_sub(MAX_TAILS);
        for (kid, _) in others.into_iter().take(over) {
            if self.remove((key, kid)).is_some() {
                self.evicted += 1;
            }
        }
        1
    }

    fn entry(
        &self,
        block: T,
        scope: &CacheScope,
        parent: BlockHash,
        tokens: &[u32],
        depth: usize,
    ) -> Entry<T> {
        Entry {
            block,
            scope: scope.clone(),
            parent,
            tokens: tokens.into(),
            depth,
            last_used: self.clock,
        }
    }

    /// Evicts unshared blocks until `bytes` are freed or none is left,
    /// those of scopes over their quota first (`scope_quota`), then least
    /// recently used first; returns the bytes freed.
    pub(crate) fn evict(&mut self, bytes: usize) -> usize {
        let mut held: HashMap<ScopeOwner, usize> = HashMap::new();
        for entry in self.entries.values() {
            *held.entry(entry.scope.owner().clone()).or_default() += entry.block.bytes();
        }
        let candidates: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| e.unread() && Some(e.last_used) != self.inserting)
            .map(|(key, e)| Candidate {
                key: *key,
                owner: e.scope.owner().clone(),
                bytes: e.block.bytes(),
                last_used: e.last_used,
                depth: e.depth,
            })
            .collect();
        let order = eviction_order(candidates, held, bytes);
        let mut freed = 0;
        for key in order {
            if freed >= bytes {
                break;
            }
            if let Some(entry) = self.remove(key) {
                freed += entry.block.bytes();
                self.evicted += 1;
            }
        }
        freed
    }

    /// Blocks evicted (budget pressure, the tails' cap) since the last call.
    pub(crate) fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The key of the tests' checkpoint (weights 7), and of another.
    const K7: CacheKey = CacheKey {
        weights: 7,
        adapter: None,
        scope: 0,
    };
    const K8: CacheKey = CacheKey {
        weights: 8,
        adapter: None,
        scope: 0,
    };

    /// The scope of tests that do not compare scopes.
    fn any() -> CacheScope {
        CacheScope::deployment()
    }

    /// A block handle whose holders are its `Arc`'s.
    #[derive(Clone, Debug)]
    struct FakeBlock(Arc<usize>);

    impl CachedBlock for FakeBlock {
        fn holders(&self) -> usize {
            Arc::strong_count(&self.0)
        }

        fn bytes(&self) -> usize {
            100
        }
    }

    /// Blocks named by their first position.
    fn share_all() -> impl FnMut(Range<usize>, &mut PrefixCache<FakeBlock>) -> Option<FakeBlock> {
        |range, _| Some(FakeBlock(Arc::new(range.start)))
    }

    /// Blocks of 4 positions and tails of whole blocks only (none).
    fn cache_with_owner() -> (PrefixCache<FakeBlock>, Arc<u8>) {
        cache_with_unit(4)
    }

    fn cache_with_unit(unit: usize) -> (PrefixCache<FakeBlock>, Arc<u8>) {
        let mut cache = PrefixCache::new(4, unit);
        let owner = Arc::new(0u8);
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&owner) as _;
        cache.register(7, weak);
        (cache, owner)
    }

    #[test]
    fn hashes_chain_so_equal_blocks_after_different_prefixes_differ() {
        let a = block_hashes(&K7, &[1, 2, 3, 4, 9, 9, 9, 9, 5], 4);
        let b = block_hashes(&K7, &[0, 2, 3, 4, 9, 9, 9, 9], 4);
        assert_eq!(a.len(), 2, "the partial tail is not a block");
        assert_ne!(a[1], b[1]);
        assert_eq!(a, block_hashes(&K7, &[1, 2, 3, 4, 9, 9, 9, 9], 4));
    }

    #[test]
    fn a_lookup_finds_the_longest_cached_prefix_and_leaves_the_last_token() {
        let (mut cache, _owner) = cache_with_owner();
        let prompt: Vec<u32> = (0..12).collect();
        assert_eq!(cache.insert(K7, &any(), &prompt, 0, &mut share_all()), 3);
        // A prompt of exactly the cached 12 tokens recomputes its last block.
        assert_eq!(cache.lookup(K7, &any(), &prompt).shared.len(), 2);
        let mut longer = prompt.clone();
        longer.push(99);
        let found = cache.lookup(K7, &any(), &longer);
        assert_eq!(
            found.shared.iter().map(|b| *b.0).collect::<Vec<_>>(),
            [0, 4, 8]
        );
        assert!(found.tail.is_none());
        // Another second block: only the first matches.
        let mut other = prompt.clone();
        other[5] = 42;
        assert_eq!(cache.lookup(K7, &any(), &other).shared.len(), 1);
        // Other weights, or the same weights under an adapter: nothing.
        assert!(cache.lookup(K8, &any(), &longer).shared.is_empty());
        let adapted = CacheKey {
            adapter: Some(1),
            ..K7
        };
        assert!(cache.lookup(adapted, &any(), &longer).shared.is_empty());
        assert_ne!(
            block_hashes(&adapted, &prompt, 4),
            block_hashes(&K7, &prompt, 4)
        );
        // Inserting again adds nothing.
        assert_eq!(cache.insert(K7, &any(), &prompt, 0, &mut share_all()), 0);
    }

    #[test]
    fn eviction_takes_unshared_blocks_least_recently_used_and_deepest_first() {
        let (mut cache, _owner) = cache_with_owner();
        let old: Vec<u32> = (100..108).collect();
        let new: Vec<u32> = (200..208).collect();
        cache.insert(K7, &any(), &old, 0, &mut share_all());
        cache.insert(K7, &any(), &new, 0, &mut share_all());
        // A running sequence holds the old prompt's first block.
        let held = cache.lookup(K7, &any(), &[100, 101, 102, 103, 0]).shared;
        assert_eq!(held.len(), 1);
        assert_eq!(cache.evict(100), 100);
        assert_eq!(cache.take_evicted(), 1);
        // The old prompt's second block went (its first is held).
        let mut probe = old.clone();
        probe.push(0);
        assert_eq!(cache.lookup(K7, &any(), &probe).shared.len(), 1);
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
        cache.insert(
            K7,
            &any(),
            &(100..104).collect::<Vec<u32>>(),
            0,
            &mut share_all(),
        );
        let prompt: Vec<u32> = (0..12).collect();
        let mut freed = Vec::new();
        let mut tight = |range: Range<usize>, cache: &mut PrefixCache<FakeBlock>| {
            // Every share past the first needs one block's room.
            if range.start > 0 {
                freed.push(cache.evict(100));
            }
            Some(FakeBlock(Arc::new(range.start)))
        };
        assert_eq!(cache.insert(K7, &any(), &prompt, 0, &mut tight), 3);
        // The old block went first; then nothing of the new chain.
        assert_eq!(freed, [100, 0]);
        assert_eq!(
            cache
                .lookup(K7, &any(), &(0..13).collect::<Vec<u32>>())
                .shared
                .len(),
            3
        );
    }

    #[test]
    fn a_failed_share_stops_the_insert_at_that_block() {
        let (mut cache, _owner) = cache_with_owner();
        let prompt: Vec<u32> = (0..12).collect();
        let mut refuse_second = |range: Range<usize>, _: &mut PrefixCache<FakeBlock>| {
            (range.start != 4).then(|| FakeBlock(Arc::new(range.start)))
        };
        assert_eq!(cache.insert(K7, &any(), &prompt, 0, &mut refuse_second), 1);
        assert_eq!(cache.len(), 1);
    }

    /// Tails are named by `1000 + their length`.
    fn share_tails() -> impl FnMut(Range<usize>, &mut PrefixCache<FakeBlock>) -> Option<FakeBlock> {
        |range, _| {
            let name = if range.len() == 4 {
                range.start
            } else {
                1000 + range.len()
            };
            Some(FakeBlock(Arc::new(name)))
        }
    }

    #[test]
    fn a_prompt_tail_serves_later_prompts_that_go_on_alike() {
        let (mut cache, _owner) = cache_with_unit(2);
        // Blocks 0..4 and 4..8, then a tail of 2 of the 3 tokens left.
        let first: Vec<u32> = (0..11).collect();
        assert_eq!(cache.insert(K7, &any(), &first, 0, &mut share_tails()), 3);
        // A prompt sharing 10 tokens: both blocks, then the tail's unit.
        let second = [&first[..10], &[50, 51]].concat();
        let found = cache.lookup(K7, &any(), &second);
        assert_eq!(found.shared.len(), 2);
        assert_eq!(
            found.tail.as_ref().map(|(b, n)| (*b.0, *n)),
            Some((1002, 2))
        );
        assert_eq!(found.prefix().positions(4), 10);
        // Sharing 5 tokens: block 0, then 1 token of block 1 (no whole unit).
        let third = [&first[..5], &[60, 61, 62, 63, 64]].concat();
        let found = cache.lookup(K7, &any(), &third);
        assert_eq!(found.shared.len(), 1);
        assert!(found.tail.is_none());
        // Sharing 7: block 0, then 2 positions copied from the full block 1.
        let fourth = [&first[..7], &[70, 71, 72]].concat();
        let found = cache.lookup(K7, &any(), &fourth);
        assert_eq!(found.tail.as_ref().map(|(b, n)| (*b.0, *n)), Some((4, 2)));
        // The same prompt again adds nothing; one that goes on further
        // replaces the tail it extends, with a longer tail or a full block.
        assert_eq!(cache.insert(K7, &any(), &first, 0, &mut share_tails()), 0);
        let full = [&first[..], &[11]].concat();
        assert_eq!(cache.insert(K7, &any(), &full, 0, &mut share_tails()), 1);
        assert_eq!(cache.len(), 3);
        let found = cache.lookup(K7, &any(), &second);
        assert_eq!(found.tail.as_ref().map(|(b, n)| (*b.0, *n)), Some((8, 2)));
        // Short prompts leave tails at the root; a longer one replaces it.
        let (mut cache, _owner) = cache_with_unit(1);
        assert_eq!(cache.insert(K7, &any(), &[5, 6], 0, &mut share_tails()), 1);
        assert_eq!(
            cache.insert(K7, &any(), &[5, 6, 7], 0, &mut share_tails()),
            1
        );
        assert_eq!(cache.len(), 1);
        let found = cache.lookup(K7, &any(), &[5, 6, 7, 9]);
        assert_eq!(
            found.tail.as_ref().map(|(b, n)| (*b.0, *n)),
            Some((1003, 3))
        );
    }

    #[test]
    fn tails_under_one_parent_are_capped_least_recently_used_first() {
        let (mut cache, _owner) = cache_with_unit(1);
        for user in 0..MAX_TAILS as u32 + 2 {
            let prompt = [0, 1, 2, 3, 100 + user, 7];
            let added = cache.insert(K7, &any(), &prompt, 0, &mut share_tails());
            assert_eq!(added, if user == 0 { 2 } else { 1 });
        }
        // The first block and MAX_TAILS tails: the two oldest went.
        assert_eq!(cache.len(), 1 + MAX_TAILS);
        assert_eq!(cache.take_evicted(), 2);
        assert!(cache
            .lookup(K7, &any(), &[0, 1, 2, 3, 100, 7, 0])
            .tail
            .is_none());
        let found = cache.lookup(K7, &any(), &[0, 1, 2, 3, 102, 7, 0]);
        assert_eq!(found.tail.map(|(_, n)| n), Some(2));
    }

    #[test]
    fn blocks_go_when_no_checkpoint_with_their_weights_is_loaded() {
        let (mut cache, owner) = cache_with_owner();
        let twin = Arc::new(1u8);
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&twin) as _;
        cache.register(7, weak);
        cache.insert(
            K7,
            &any(),
            &(0..8).collect::<Vec<u32>>(),
            0,
            &mut share_all(),
        );
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

    #[test]
    fn a_scope_finds_only_its_own_blocks_and_tails() {
        let (mut cache, _owner) = cache_with_unit(1);
        let a = CacheScope::tenant("a");
        let b = CacheScope::tenant("b");
        let salted = a.clone().with_salt(Some("s"));
        // Two full blocks and a tail of 2, cached for tenant a.
        let prompt: Vec<u32> = (0..10).collect();
        assert_eq!(cache.insert(K7, &a, &prompt, 0, &mut share_tails()), 3);
        let probe = [&prompt[..], &[99]].concat();
        assert_eq!(cache.lookup(K7, &a, &probe).prefix().positions(4), 10);
        for other in [&b, &salted, &any()] {
            let found = cache.lookup(K7, other, &probe);
            assert!(found.shared.is_empty() && found.tail.is_none(), "{other:?}");
        }
        // B's copy of the same prompt is its own chain: a's stays as it was.
        assert_eq!(cache.insert(K7, &b, &prompt, 0, &mut share_tails()), 3);
        assert_eq!(cache.len(), 6);
        assert_eq!(cache.lookup(K7, &b, &probe).prefix().positions(4), 10);
        assert_eq!(
            block_hashes(&K7.with_scope(&a), &prompt, 4),
            block_hashes(&K7.with_scope(&CacheScope::tenant("a")), &prompt, 4)
        );
        assert_ne!(
            block_hashes(&K7.with_scope(&a), &prompt, 4),
            block_hashes(&K7.with_scope(&b), &prompt, 4)
        );
    }

    #[test]
    fn a_busy_scope_evicts_its_own_blocks_before_another_scopes_share() {
        let (mut cache, _owner) = cache_with_owner();
        let light = CacheScope::tenant("light");
        let heavy = CacheScope::tenant("heavy");
        // The light tenant's prompt is the oldest in the cache.
        cache.insert(
            K7,
            &light,
            &(500..508).collect::<Vec<u32>>(),
            0,
            &mut share_all(),
        );
        for first in [0u32, 100, 200] {
            let prompt: Vec<u32> = (first..first + 8).collect();
            cache.insert(K7, &heavy, &prompt, 0, &mut share_all());
        }
        // 8 blocks: light holds 2, heavy 6 (quota 4 each). Making room for
        // 4 blocks takes heavy's oldest, however old light's are.
        assert_eq!(cache.evict(400), 400);
        let probe = |cache: &mut PrefixCache<FakeBlock>, scope, first: u32| {
            let prompt: Vec<u32> = (first..first + 9).collect();
            cache.lookup(K7, scope, &prompt).shared.len()
        };
        assert_eq!(probe(&mut cache, &light, 500), 2);
        assert_eq!(probe(&mut cache, &heavy, 0), 0);
        assert_eq!(probe(&mut cache, &heavy, 100), 0);
        assert_eq!(probe(&mut cache, &heavy, 200), 2);
        // Past every share, least recently used first again.
        assert_eq!(cache.evict(100), 100);
        assert_eq!(probe(&mut cache, &light, 500), 1);
    }
}
