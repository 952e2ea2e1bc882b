//! The prompt cache over sliding-window layers (Gemma 3's local layers;
//! design: docs/SLIDING_WINDOW_PROMPT_CACHE.md).
//!
//! A windowed layer keeps a ring of blocks whose slots are overwritten as
//! the window moves, so its blocks cannot be shared in place as a global
//! layer's are. What a later request needs of it to go on from a cached
//! prefix of `P` positions is only the window before `P`. The cache keeps,
//! with the block where a prompt ended (its tail, or its last full block),
//! a copy of every windowed layer's ring as it stood when the prompt's
//! last position was written (`len` positions): a [`WindowSnapshot`]. A
//! new cache starts from it by copying the rings into its own, at the same
//! slots, if the rings still held the window before `P` (see
//! [`WindowSnapshot::serves`]); the global layers share their blocks as
//! for any model.

use switchyard_kernels::KvLayout;

use super::block::SharedBlock;
use super::prefix_cache::Found;
#[cfg(doc)]
use super::window_snapshot::WindowSnapshot;
use switchyard_kernels::Backend;

/// `found` cut back to what a cache of `layout` can start from: all of it
/// for a layout without windows; for a windowed one, the found blocks up
/// to the deepest whose window snapshot serves where it ends, or nothing.
pub(crate) fn usable<B: Backend>(
    found: Found<SharedBlock<B>>,
    layout: &KvLayout,
) -> Found<SharedBlock<B>> {
    if !layout.windowed() {
        return found;
    }
    let block = layout.block_positions();
    let Found { mut shared, tail } = found;
    if let Some((tail, n)) = tail {
        let start = shared.len() * block + n;
        if tail.window().is_some_and(|w| w.serves(layout, start)) {
            return Found {
                shared,
                tail: Some((tail, n)),
            };
        }
    }
    // A prompt that ended on a block boundary left its snapshot with its
    // last full block.
    while let Some(last) = shared.last() {
        if last
            .window()
            .is_some_and(|w| w.serves(layout, shared.len() * block))
        {
            return Found { shared, tail: None };
        }
        shared.pop();
    }
    Found::none()
}
