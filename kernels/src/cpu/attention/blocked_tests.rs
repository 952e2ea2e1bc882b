//! The blocked kernels bit for bit against the per-row scalar kernels
//! they stand in for, on every ISA, for query counts around the register
//! blocks and head sizes that leave chains of unequal length.

use rand::{Rng, SeedableRng};

use super::super::bf16::{self, Bf16Isa};
use super::super::scores::scores16_scalar;
use super::*;
use crate::cpu::vecmath::weighted_sum_scalar;
use crate::cpu::Isa;

const QUERIES: [usize; 6] = [1, 5, 12, 13, 25, 32];

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|x| x.to_bits()).collect()
}

/// What each kernel can run on: every ISA of the host, and for BF16 the
/// SIMD kernels where the host has them and the scalar twins.
fn bf16_kinds() -> Vec<Bf16Isa> {
    let mut kinds = vec![Bf16Isa::scalar()];
    let best = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    if Bf16Isa::new(best).simd() {
        kinds.push(Bf16Isa::new(best));
    }
    kinds
}

#[test]
fn f32_scores_and_sums_are_the_per_row_kernels_bits() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    for isa in Isa::supported() {
        let isa = CheckedIsa::at_most(isa);
        for hd in [1usize, 3, 4, 7, 33, 64, 100, 256] {
            let keys = random(&mut rng, 2 * KEY_TILE * hd);
            let values = random(&mut rng, KEY_BLOCK * hd);
            for n in QUERIES {
                let qs = random(&mut rng, n * hd);
                let (mut qc, mut part) = (Vec::new(), Vec::new());
                pack_f32(|qi| &qs[qi * hd..(qi + 1) * hd], n, hd, &mut qc);
                let mut got = vec![0.0; n * KEY_BLOCK];
                scores_f32(isa, &qc, (n, hd), &keys, 0.3, &mut part, &mut got);
                let mut want = [0.0; KEY_TILE];
                for qi in 0..n {
                    for t in 0..2 {
                        let tile = &keys[t * KEY_TILE * hd..(t + 1) * KEY_TILE * hd];
                        scores16_scalar(&qs[qi * hd..(qi + 1) * hd], tile, 0.3, &mut want);
                        let at = qi * KEY_BLOCK + t * KEY_TILE;
                        let got = &got[at..at + KEY_TILE];
                        assert_eq!(bits(got), bits(&want), "{isa:?} hd {hd} n {n} q {qi}");
                    }
                }
                // The scores as weights (any values serve) on running sums.
                let acc0 = random(&mut rng, n * hd);
                let mut acc = acc0.clone();
                weighted_f32(isa, &got, (n, hd), &values, &mut acc);
                for qi in 0..n {
                    let mut want = acc0[qi * hd..(qi + 1) * hd].to_vec();
                    let p = &got[qi * KEY_BLOCK..(qi + 1) * KEY_BLOCK];
                    weighted_sum_scalar(p, &values, &mut want);
                    let got = &acc[qi * hd..(qi + 1) * hd];
                    assert_eq!(bits(got), bits(&want), "{isa:?} hd {hd} n {n} sums {qi}");
                }
            }
        }
    }
}

#[test]
fn bf16_scores_and_sums_are_the_scalar_twins_bits() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(43);
    for b in bf16_kinds() {
        for hd in [1usize, 2, 3, 6, 33, 64, 256] {
            let pairs = hd.div_ceil(2);
            // Packed operands straight from random bits rounded to BF16
            // (`pack_in_order` of random floats).
            let pack = |rng: &mut rand_chacha::ChaCha8Rng, n: usize| -> Vec<u32> {
                let x = random(rng, 2 * n);
                let mut out = vec![0u32; n];
                bf16::pack_in_order(Bf16Isa::scalar(), &x, &mut out);
                out
            };
            let keys = pack(&mut rng, 2 * KEY_TILE * pairs);
            let values = pack(&mut rng, KEY_BLOCK / 2 * hd);
            for n in QUERIES {
                let q_pairs = pack(&mut rng, n * pairs);
                let (mut qb, mut part) = (Vec::new(), Vec::new());
                pack_bf16(&q_pairs, n, pairs, &mut qb);
                let mut got = vec![0.0; n * KEY_BLOCK];
                scores_bf16(b, &qb, (n, pairs), &keys, 0.3, &mut part, &mut got);
                let mut want = [0.0; KEY_BLOCK];
                for qi in 0..n {
                    let q = &q_pairs[qi * pairs..(qi + 1) * pairs];
                    bf16::scores_scalar(q, &keys, 0.3, &mut want);
                    let got = &got[qi * KEY_BLOCK..(qi + 1) * KEY_BLOCK];
                    assert_eq!(bits(got), bits(&want), "{b:?} hd {hd} n {n} q {qi}");
                }
                let p = pack(&mut rng, n * KEY_BLOCK / 2);
                let acc0 = random(&mut rng, n * hd);
                let mut acc = acc0.clone();
                weighted_bf16(b, &p, (n, hd), &values, &mut acc);
                for qi in 0..n {
                    let mut want = acc0[qi * hd..(qi + 1) * hd].to_vec();
                    let ps = [&p[qi * KEY_BLOCK / 2..(qi + 1) * KEY_BLOCK / 2]];
                    bf16::weighted_sum(Bf16Isa::scalar(), &ps, &values, &mut want);
                    let got = &acc[qi * hd..(qi + 1) * hd];
                    assert_eq!(bits(got), bits(&want), "{b:?} hd {hd} n {n} sums {qi}");
                }
            }
        }
    }
}
