//! The BF16 kernels against their scalar twins, bit for bit, and the
//! twins' rounding against the instructions they stand for.

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::Isa;

/// Values over a wide range of magnitudes (so that the order and the
/// count of roundings in a sum show), with both signs, some zeros and a
/// few denormals (the instructions read them as zero).
fn awkward(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.random_range(0..40) {
            0 => 0.0,
            1 => f32::from_bits(rng.random_range(1..0x007f_ffff)),
            2 => -f32::from_bits(rng.random_range(1..0x007f_ffff)),
            _ => {
                let m: f32 = rng.random_range(-1.0..1.0);
                m * 2f32.powi(rng.random_range(-30..12))
            }
        })
        .collect()
}

fn simd() -> Option<Bf16Isa> {
    let isa = Bf16Isa::new(CheckedIsa::at_most(Isa::Avx512Vnni));
    if !isa.simd() {
        println!("no AVX-512 BF16 here: only the scalar twins ran");
    }
    isa.simd().then_some(isa)
}

#[test]
fn rounding_is_to_nearest_even_and_flushes_denormals() {
    // 1 + 2⁻⁸ lies halfway between BF16 1.0 and 1 + 2⁻⁷: even is 1.0.
    assert_eq!(round(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    assert_eq!(round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
    assert_eq!(round(-0.0), 0x8000);
    assert_eq!(round(-f32::from_bits(5)), 0x8000);
    assert_eq!(round(f32::MAX), 0x7f80); // rounds up to infinity
    assert_eq!(round(f32::NEG_INFINITY), 0xff80);
    assert_eq!(round(f32::from_bits(0x7f80_0001)) & 0x7fc0, 0x7fc0);
}

#[test]
fn packing_matches_the_instruction_rounding() {
    let Some(isa) = simd() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    let mut src = awkward(&mut rng, 4096);
    src.extend([
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NAN,
        1.0 + 2f32.powi(-8),
    ]);
    src.extend((0..27).map(|i| f32::from_bits(0x3f80_8000 + (i << 16))));
    let scalar = Bf16Isa::scalar();
    for n in [0, 1, 15, 16, 17, 33, src.len()] {
        let (even, odd) = (&src[..n], &src[src.len() - n..]);
        let (mut got, mut want) = (vec![0u32; n + 3], vec![0u32; n + 3]);
        pack(isa, even, odd, &mut got);
        pack(scalar, even, odd, &mut want);
        assert_eq!(got, want, "pack of {n}");
        let (mut got, mut want) = (vec![0u32; n.div_ceil(2) + 2], vec![0u32; n.div_ceil(2) + 2]);
        pack_in_order(isa, even, &mut got);
        pack_in_order(scalar, even, &mut want);
        assert_eq!(got, want, "pack in order of {n}");
    }
    // A key tile (one call for every pair row) against the scalar twin.
    for hd in [1, 2, 3, 64, 256] {
        let tile = &src[..hd * KEY_TILE];
        let pairs = hd.div_ceil(2) * KEY_TILE;
        let (mut got, mut want) = (vec![0u32; pairs], vec![0u32; pairs]);
        pack_key_tile(isa, tile, hd, &mut got);
        pack_key_tile(scalar, tile, hd, &mut want);
        assert_eq!(got, want, "key tile of {hd}");
    }
}

#[test]
fn dot_products_are_bit_for_bit_the_scalar_twins() {
    let Some(isa) = simd() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let scalar = Bf16Isa::scalar();
    let pairs_of = |rng: &mut rand_chacha::ChaCha8Rng, n: usize| -> Vec<u32> {
        let x = awkward(rng, 2 * n);
        let mut p = vec![0; n];
        pack_in_order(scalar, &x, &mut p);
        p
    };
    for pairs in [1usize, 2, 3, 4, 5, 32, 33, 128] {
        let keys = pairs_of(&mut rng, 2 * pairs * KEY_TILE);
        for g in 1..=GROUP_MAX {
            let qs: Vec<Vec<u32>> = (0..g).map(|_| pairs_of(&mut rng, pairs)).collect();
            let refs: Vec<&[u32]> = qs.iter().map(|q| &q[..]).collect();
            let (mut got, mut want) = ([[0.0f32; 32]; GROUP_MAX], [[0.0f32; 32]; GROUP_MAX]);
            scores(isa, &refs, &keys, 0.0625, &mut got);
            scores(scalar, &refs, &keys, 0.0625, &mut want);
            let bits =
                |s: &[[f32; 32]]| -> Vec<u32> { s.iter().flatten().map(|x| x.to_bits()).collect() };
            assert_eq!(
                bits(&got[..g]),
                bits(&want[..g]),
                "scores: {pairs} pairs, {g} queries"
            );
        }
    }
    for (rows, width) in [(1usize, 1usize), (16, 64), (16, 256), (7, 33), (3, 100)] {
        let values = pairs_of(&mut rng, rows * width);
        for g in 1..=GROUP_MAX {
            let ps: Vec<Vec<u32>> = (0..g).map(|_| pairs_of(&mut rng, rows)).collect();
            let refs: Vec<&[u32]> = ps.iter().map(|p| &p[..]).collect();
            // A running output, denormals and all.
            let start = awkward(&mut rng, g * width);
            let (mut got, mut want) = (start.clone(), start);
            weighted_sum(isa, &refs, &values, &mut got);
            weighted_sum(scalar, &refs, &values, &mut want);
            let bits = |s: &[f32]| -> Vec<u32> { s.iter().map(|x| x.to_bits()).collect() };
            assert_eq!(
                bits(&got),
                bits(&want),
                "weighted sum: {rows}×{width}, {g} rows of weights"
            );
        }
    }
}

/// Why the twin adds the odd product first and rounds each sum: with
/// `acc = 1` and the products `(a₀b₀, a₁b₁)`, (2⁻²⁴, 2⁻²⁴) gives 1 with two
/// roundings (each sum a tie, to even) where one rounding of the exact sum
/// gives 1 + 2⁻²³; (1.5·2⁻²⁴, 2⁻²⁴) gives 1 + 2⁻²³ odd first, 1 + 2⁻²² even
/// first.
#[test]
fn the_instruction_adds_the_odd_product_first_rounding_each() {
    let p = |lo: f32, hi: f32| u32::from(round(lo)) | u32::from(round(hi)) << 16;
    let ones = p(1.0, 1.0);
    let cases = [
        (p(2f32.powi(-24), 2f32.powi(-24)), 1.0),
        (
            p(1.5 * 2f32.powi(-24), 2f32.powi(-24)),
            1.0 + 2f32.powi(-23),
        ),
    ];
    let isa = simd();
    for (b, want) in cases {
        assert_eq!(dot2(1.0, ones, b), want);
        if let Some(isa) = isa {
            let mut got = [1.0f32];
            weighted_sum(isa, &[&[ones]], &[b], &mut got);
            assert_eq!(got[0].to_bits(), want.to_bits(), "vdpbf16ps");
        }
    }
}
