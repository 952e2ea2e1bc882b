//! AMX tiles against the scalar twin, bit for bit: the integer block sums
//! are exact and the f32 steps the same, so nothing may differ.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::amx::{AmxRows, AMX_ROWS};
use super::tests::{quantized, random_rows, PACKED_TYPES};
use super::*;
use crate::cpu::weight_arena::WeightArena;

#[test]
fn amx_tiles_match_scalar_twin_bit_for_bit() {
    let vnni = CheckedIsa::at_most(Isa::Avx512Vnni);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let bits = |v: &[[f32; GROUP_ROWS]; AMX_ROWS]| -> Vec<u32> {
        v.iter().flatten().map(|f| f.to_bits()).collect()
    };
    let mut checked = 0;
    // Two rounds, so each type meets a scratch another type filled.
    for _ in 0..2 {
        for dtype in PACKED_TYPES {
            let elems = Layout::of(dtype).elems;
            let sizes: &[usize] = if elems > QK {
                &[1, 3, 8]
            } else {
                &[2, 4, 6, 20, 64]
            };
            for &blocks in sizes {
                let (rows, k) = (48, blocks * elems);
                let data = random_rows(&mut rng, dtype, rows, k);
                let view = WeightView::new(dtype, rows, k, data.into())
                    .expect("random rows of whole blocks make a view");
                let packed = PackedRows::pack(&view, &WeightArena::default())
                    .expect("an unlimited arena packs the rows");
                if !packed.takes_amx(vnni) {
                    println!("{dtype}: AMX-INT8 not granted on this CPU; nothing to compare");
                    continue;
                }
                let q = quantized(&mut rng, vnni, AMX_ROWS, k);
                let a: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t));
                let rows_ok =
                    AmxRows::new(&a).expect("rows of one quantized matrix share a stride");
                for g in 0..packed.groups() {
                    let (group, blocks) = (packed.group(g), packed.blocks);
                    let mut want = [[0.0f32; GROUP_ROWS]; AMX_ROWS];
                    scalar::dot_group(dtype, group, blocks, &a, want.each_mut(), false);
                    let start: [[f32; GROUP_ROWS]; AMX_ROWS] = std::array::from_fn(|t| {
                        std::array::from_fn(|r| (t * 7 + r) as f32 * 0.37 - 3.0)
                    });
                    let mut want_acc = start;
                    scalar::dot_group(dtype, group, blocks, &a, want_acc.each_mut(), true);
                    let mut got = [[f32::NAN; GROUP_ROWS]; AMX_ROWS];
                    let mut got_acc = start;
                    let ran = packed.with_amx_group(vnni, g, |u| {
                        if !packed.amx_fits(u, &rows_ok) {
                            return false;
                        }
                        packed.dot_group_amx(u, &rows_ok, got.each_mut(), false);
                        packed.dot_group_amx(u, &rows_ok, got_acc.each_mut(), true);
                        true
                    });
                    assert_eq!(ran, Some(true), "{dtype} k={k}: AMX declined the tile");
                    assert_eq!(bits(&got), bits(&want), "{dtype} k={k} group {g}: AMX");
                    assert_eq!(
                        bits(&got_acc),
                        bits(&want_acc),
                        "{dtype} k={k} group {g}: accumulating AMX"
                    );
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} groups compared");
}

/// Any sixteen rows of one width of whole tile rows are taken (they are
/// copied into tile order); rows of another width or of a single block
/// are not (the caller then runs the VNNI kernel).
#[test]
fn amx_takes_rows_of_one_width_of_whole_tile_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let vnni = CheckedIsa::at_most(Isa::Avx512Vnni);
    let q = quantized(&mut rng, vnni, AMX_ROWS + 1, 64);
    let consecutive: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t));
    assert!(AmxRows::new(&consecutive).is_some());
    // Row 1 twice: not one buffer's consecutive rows, but copied alike.
    let repeated: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t.max(1)));
    assert!(AmxRows::new(&repeated).is_some());
    // One row of another width.
    let wide = quantized(&mut rng, vnni, 1, 128);
    let mixed: [QRow<'_>; AMX_ROWS] =
        std::array::from_fn(|t| if t == 3 { wide.row(0) } else { q.row(t) });
    assert!(AmxRows::new(&mixed).is_none());
    // One 32-element block: not a whole 64-byte tile row.
    let q = quantized(&mut rng, vnni, AMX_ROWS, 32);
    let narrow: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t));
    assert!(AmxRows::new(&narrow).is_none());
}
