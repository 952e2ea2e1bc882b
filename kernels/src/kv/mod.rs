//! The KV cache as every device sees it: the element type ([`KvType`]),
//! the blocks of a sequence ([`KvLayout`]), the ids that name a backend's
//! blocks and a sequence's table of them ([`BlockTable`]), and what a new
//! cache starts from ([`KvPrefix`]).
//!
//! These are formats, not policy: the engine's `kv` module decides which
//! caches exist, what they may reserve from the KV budget, which blocks
//! each sequence holds and the prompt cache keeps and shares; a backend
//! stores blocks by id and attends over the tables it is given.

mod kv_type;
mod layout;
mod table;

pub use kv_type::KvType;
pub(crate) use kv_type::{Q8_GROUP, Q8_GROUP_BYTES};
pub use layout::{
    block_len, check_block_positions, KvBlockShape, KvFormat, KvLayout, DEFAULT_BLOCK_POSITIONS,
    KV_UNIT, MAX_BLOCK_POSITIONS, RING_SLACK,
};
pub use table::{BlockId, BlockTable};

/// What a new cache starts from (the prompt cache's find): `shared` full
/// blocks read in place, then the first `tail.1` positions of `tail.0`
/// (a multiple of [`KV_UNIT`]) copied into the cache's own next block.
pub struct KvPrefix<'a, K> {
    pub shared: &'a [K],
    pub tail: Option<(&'a K, usize)>,
}

impl<K> KvPrefix<'_, K> {
    /// Nothing: a cache that starts empty.
    pub fn none() -> Self {
        KvPrefix {
            shared: &[],
            tail: None,
        }
    }

    /// Positions the prefix covers, with blocks of `block_positions`.
    pub fn positions(&self, block_positions: usize) -> usize {
        self.shared.len() * block_positions + self.tail.map_or(0, |(_, n)| n)
    }
}
