//! Which spans a tile reads from the shared blocks: only those packed
//! as the tile would pack them itself (the bits are `chunk_tests.rs`'s:
//! a whole prompt's tiles share, a chunk of one row packs its own).

use super::*;

/// Blocks 4..12 (positions 128..384) shared, 1 pair a block, keys
/// numbered by block and values by block + 100, written up to `end`.
fn shared<'s>(keys: &'s [u32], values: &'s [u32], end: usize) -> SharedBlocks<'s> {
    SharedBlocks {
        keys,
        values,
        first: 4,
        blocks: 8,
        block_pairs: 1,
        end,
    }
}

#[test]
fn a_tile_reads_shared_blocks_only_where_they_are_packed_as_its_own() {
    let keys: Vec<u32> = (4..12).collect();
    let values: Vec<u32> = (104..112).collect();
    // The chunk's rows end at 370, inside block 11.
    let s = shared(&keys, &values, 370);
    let span = s.span(5, 8, 370).expect("blocks 5..8, whole for the tile");
    assert_eq!(
        (span.keys, span.values, span.blocks),
        (&[5, 6, 7][..], &[105, 106, 107][..], 3)
    );
    // A tile ending at 240 (inside block 7): its block 7 packs with
    // values 0 from 240 on, the shared one from 370 on.
    assert!(s.span(5, 8, 240).is_none());
    // Whole for a tile ending at a block's edge.
    assert!(s.span(5, 8, 256).is_some());
    // The last tile ends where the chunk does: the same zeros.
    let last = s.span(8, 12, 370).expect("the chunk's last span");
    assert_eq!(last.keys, &[8, 9, 10, 11][..]);
    // Outside the shared blocks (a cap cut them off), or empty.
    assert!(s.span(3, 6, 370).is_none());
    assert!(s.span(10, 13, 370).is_none());
    assert!(s.span(6, 6, 370).is_none());
}
