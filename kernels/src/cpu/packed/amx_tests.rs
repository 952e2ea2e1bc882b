//! AMX tiles against the scalar twin, bit for bit: the integer block sums
//! are exact and the f32 steps the same, so nothing may differ.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::amx::AMX_ROWS;
use super::tests::{quantized, random_rows};
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
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::IQ4NL,
            DType::Q4K,
            DType::Q6K,
        ] {
            let elems = Layout::of(dtype).elems;
            let sizes: &[usize] = if elems > QK { &[1, 3, 8] } else { &[2, 4, 20, 64] };
            for &blocks in sizes {
                let (rows, k) = (48, blocks * elems);
                let data = random_rows(&mut rng, dtype, rows, k);
                let view = WeightView::new(dtype, rows, k, data.into()).unwrap();
                let packed = PackedRows::pack(&view, &WeightArena::default()).unwrap();
                if !packed.takes_amx(vnni) {
                    println!("{dtype}: AMX-INT8 not granted on this CPU; nothing to compare");
                    continue;
                }
                let q = quantized(&mut rng, vnni, AMX_ROWS, k);
                let a: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t));
                let tile = packed.tile(&a);
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
                        let plain = packed.dot_group_amx(u, &tile, got.each_mut(), false);
                        let acc = packed.dot_group_amx(u, &tile, got_acc.each_mut(), true);
                        plain.is_ok() && acc.is_ok()
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

/// A tile whose rows are not one buffer's consecutive rows is given back
/// untouched (the caller then runs the VNNI kernel).
#[test]
fn amx_gives_back_rows_it_cannot_load_at_one_stride() {
    let vnni = CheckedIsa::at_most(Isa::Avx512Vnni);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (rows, k) = (16, 64);
    let data = random_rows(&mut rng, DType::Q8_0, rows, k);
    let view = WeightView::new(DType::Q8_0, rows, k, data.into()).unwrap();
    let packed = PackedRows::pack(&view, &WeightArena::default()).unwrap();
    if !packed.takes_amx(vnni) {
        println!("AMX-INT8 not granted on this CPU; nothing to check");
        return;
    }
    let q = quantized(&mut rng, vnni, AMX_ROWS + 1, k);
    // Row 1 twice: not sixteen consecutive rows.
    let a: [QRow<'_>; AMX_ROWS] = std::array::from_fn(|t| q.row(t.max(1)));
    let tile = packed.tile(&a);
    let mut out = [[7.0f32; GROUP_ROWS]; AMX_ROWS];
    let ran = packed.with_amx_group(vnni, 0, |u| {
        packed.dot_group_amx(u, &tile, out.each_mut(), false).is_err()
    });
    assert_eq!(ran, Some(true));
    assert!(out.iter().flatten().all(|&v| v == 7.0));
}
