//! The f32 layout of one KV head's part of a key block, as attention reads
//! it, and how key blocks make up the cache's blocks: here apart from
//! `kv_cache` so that the element types (`kv_elem`, `kv_q8`) that produce
//! it and the cache that stores them need no cycle.

/// Positions per key tile: the sixteen f32 lanes of a zmm.
pub(crate) const KEY_TILE: usize = 16;

/// Positions per key block: the attention's unit (`attention::stream`),
/// read whole and once per task. 32 keys and 32 values of 64 f32 are
/// 16 KB, half of L1.
pub(crate) const KEY_BLOCK: usize = 2 * KEY_TILE;

/// Where dimension 0 of the key at `lane` (of the key block) lies in the f32
/// run: dimension `d` is `d * KEY_TILE` further.
pub(crate) fn key_at(lane: usize, head_dim: usize) -> usize {
    (lane / KEY_TILE) * KEY_TILE * head_dim + lane % KEY_TILE
}

/// Where the value at `lane` starts in the f32 run (after both key tiles).
pub(crate) fn value_at(lane: usize, head_dim: usize) -> usize {
    KEY_BLOCK * head_dim + lane * head_dim
}

// A key block is the device-neutral unit blocks and tails are made of.
const _: () = assert!(KEY_BLOCK == crate::kv::KV_UNIT);
