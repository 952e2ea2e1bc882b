//! Group kernels: SIMD against the scalar twin bit for bit, and the
//! scalar twin against the per-row scalar kernels (same arithmetic in exact
//! terms, different f32 order) on random awkward sizes.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::layout::has_min;
use super::*;

use crate::cpu::dot::dot_quantized;
use crate::cpu::quant_act::QuantizedRows;
use crate::cpu::weight_arena::WeightArena;

/// Every type the group kernels pack.
pub(super) const PACKED_TYPES: [DType; 8] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4NL,
    DType::Q4K,
    DType::Q6K,
];

pub(super) fn random_rows(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, k: usize) -> Vec<u8> {
    if matches!(dtype, DType::Q4K | DType::Q6K) {
        return random_k_rows(rng, dtype, rows, k);
    }
    let mut out = Vec::new();
    for _ in 0..rows * k / QK {
        let scale = rng.random_range(0.001f32..0.05);
        out.extend(half::f16::from_f32(scale).to_le_bytes());
        if has_min(dtype) {
            let min = -8.0 * scale * rng.random_range(0.5f32..1.5);
            out.extend(half::f16::from_f32(min).to_le_bytes());
        }
        if matches!(dtype, DType::Q5_0 | DType::Q5_1) {
            out.extend((0..4).map(|_| rng.random::<u8>()));
        }
        let quants = if dtype == DType::Q8_0 { 32 } else { 16 };
        out.extend((0..quants).map(|_| rng.random::<u8>()));
    }
    out
}

/// K-type blocks: random quants and 6-bit (Q4_K) or i8 (Q6_K) scales,
/// small finite f16 `d` (and `dmin`).
fn random_k_rows(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, k: usize) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let mut out: Vec<u8> = (0..rows * k / 256 * bb).map(|_| rng.random()).collect();
    let d_at = if dtype == DType::Q4K { 0 } else { 208 };
    for block in out.chunks_exact_mut(bb) {
        let d = half::f16::from_f32(rng.random_range(0.0005f32..0.005));
        block[d_at..d_at + 2].copy_from_slice(&d.to_le_bytes());
        if dtype == DType::Q4K {
            let dmin = half::f16::from_f32(rng.random_range(0.0005f32..0.01));
            block[2..4].copy_from_slice(&dmin.to_le_bytes());
        }
    }
    out
}

pub(super) fn quantized(
    rng: &mut ChaCha8Rng,
    isa: CheckedIsa,
    n: usize,
    k: usize,
) -> QuantizedRows {
    let x: Vec<f32> = (0..n * k)
        .map(|i| {
            if i % 37 == 5 {
                rng.random_range(-40.0f32..40.0)
            } else {
                rng.random_range(-2.0f32..2.0)
            }
        })
        .collect();
    let mut q = QuantizedRows::default();
    q.quantize(isa, &x, n, k);
    q
}

fn check<const T: usize>(packed: &PackedRows, q: &QuantizedRows, simd: Option<CheckedIsa>) {
    let a: [QRow<'_>; T] = std::array::from_fn(|t| q.row(t));
    for g in 0..packed.groups() {
        let bits = |v: &[[f32; GROUP_ROWS]; T]| -> Vec<u32> {
            v.iter().flatten().map(|f| f.to_bits()).collect()
        };
        let (dtype, group, blocks) = (packed.dtype, packed.group(g), packed.blocks);
        let mut want = [[0.0f32; GROUP_ROWS]; T];
        scalar::dot_group(dtype, group, blocks, &a, want.each_mut(), false);
        // Accumulating adds the finished sums to what `out` held.
        let start: [[f32; GROUP_ROWS]; T] =
            std::array::from_fn(|t| std::array::from_fn(|r| (t * 7 + r) as f32 * 0.37 - 3.0));
        let mut want_acc = start;
        scalar::dot_group(dtype, group, blocks, &a, want_acc.each_mut(), true);
        let mut sum = start;
        sum.iter_mut()
            .flatten()
            .zip(want.iter().flatten())
            .for_each(|(s, w)| *s += w);
        assert_eq!(
            bits(&want_acc),
            bits(&sum),
            "{dtype} group {g}: scalar accumulate"
        );
        if let Some(isa) = simd {
            let mut got = [[0.0f32; GROUP_ROWS]; T];
            packed.dot_group(isa, g, &packed.tile(&a), got.each_mut(), false);
            assert_eq!(
                bits(&got),
                bits(&want),
                "{dtype} group {g} T={T}: SIMD differs from scalar"
            );
            let mut got = start;
            packed.dot_group(isa, g, &packed.tile(&a), got.each_mut(), true);
            assert_eq!(
                bits(&got),
                bits(&want_acc),
                "{dtype} group {g} T={T}: accumulating SIMD differs from scalar"
            );
        }
    }
}

#[test]
fn simd_group_kernels_match_scalar_twin_bit_for_bit() {
    let vnni = CheckedIsa::at_most(Isa::Avx512Vnni);
    let simd = (vnni.get() == Isa::Avx512Vnni).then_some(vnni);
    if simd.is_none() {
        println!("AVX-512 VNNI not on this CPU: only the scalar twin runs");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for dtype in PACKED_TYPES {
        let elems = Layout::of(dtype).elems;
        for rows in [16usize, 33, 48] {
            for blocks in [1usize, 2, 3, 7, 18] {
                if elems > QK && blocks > 3 {
                    continue;
                }
                let k = blocks * elems;
                let data = random_rows(&mut rng, dtype, rows, k);
                let view = WeightView::new(dtype, rows, k, data.into())
                    .expect("random rows of whole blocks make a view");
                let packed = PackedRows::pack(&view, &WeightArena::default())
                    .expect("an unlimited arena packs the rows");
                assert_eq!(packed.rows(), rows / 16 * 16);
                let q = quantized(&mut rng, vnni, 16, k);
                check::<1>(&packed, &q, simd);
                check::<2>(&packed, &q, simd);
                check::<3>(&packed, &q, simd);
                check::<4>(&packed, &q, simd);
                check::<8>(&packed, &q, simd);
                check::<16>(&packed, &q, simd);
            }
        }
    }
}

/// The packed scalar twin and the per-row scalar kernel compute the same
/// exact terms (integer block sums, `d_w · d_a`, `m · s`); only the f32
/// rounding differs (fused multiply-adds against a product then an add),
/// one rounding of ≤ 2⁻²⁴ per block term, 36 terms of a 576-wide row.
/// Outputs here are O(1-10) with terms of similar size, so 1e-4 of
/// `max(|out|, 1)` is ~100× that random walk yet far below the ≥ 1e-3
/// error any wrong nibble, scale or offset makes.
#[test]
fn packed_twin_agrees_with_per_row_kernel() {
    let scalar = CheckedIsa::at_most(Isa::Scalar);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for dtype in PACKED_TYPES {
        let rows = 32;
        let k = if Layout::of(dtype).elems > QK {
            3 * 256
        } else {
            18 * QK
        };
        let blocks = k / Layout::of(dtype).elems;
        let data = random_rows(&mut rng, dtype, rows, k);
        let view = WeightView::new(dtype, rows, k, data.clone().into())
            .expect("random rows of whole blocks make a view");
        let packed = PackedRows::pack(&view, &WeightArena::default())
            .expect("an unlimited arena packs the rows");
        let q = quantized(&mut rng, scalar, 1, k);
        let a = [q.row(0)];
        let mut per_row = vec![0.0f32; rows];
        dot_quantized::<1>(scalar, dtype, &data, view.row_bytes(), &a, &mut per_row);
        for g in 0..packed.groups() {
            let mut got = [[0.0f32; GROUP_ROWS]; 1];
            scalar::dot_group(dtype, packed.group(g), blocks, &a, got.each_mut(), false);
            for r in 0..GROUP_ROWS {
                let want = per_row[g * GROUP_ROWS + r];
                let diff = (got[0][r] - want).abs();
                assert!(
                    diff <= 1e-4 * want.abs().max(1.0),
                    "{dtype} row {}: packed {} vs per-row {want}",
                    g * GROUP_ROWS + r,
                    got[0][r]
                );
            }
        }
    }
}
