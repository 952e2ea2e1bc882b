//! The blocked kernels bit for bit against the per-row scalar kernels
//! they stand in for, on every ISA, for query counts around the register
//! blocks and head sizes that leave chains of unequal length.

use rand::{Rng, SeedableRng};

use super::super::bf16::{self, Bf16Isa};
use super::super::scores::scores16_scalar;
use super::*;
use crate::cpu::vecmath::weighted_sum_scalar;
use crate::cpu::Isa;

/// Query counts around the register blocks (12, 6) and AMX's tiles of
/// sixteen rows (one, two, three tiles and partial ones).
const QUERIES: [usize; 7] = [1, 5, 12, 13, 25, 32, 48];

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|x| x.to_bits()).collect()
}

/// What each kernel can run on: every ISA of the host, and for BF16 the
/// scalar twins and the AVX-512 BF16 kernels where the host has them
/// (without AMX, which rounds its own way: see [`amx_kernel`]).
fn bf16_kinds() -> Vec<Bf16Isa> {
    let mut kinds = vec![Bf16Isa::scalar()];
    let best = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = Bf16Isa::new(best);
    if b.simd() {
        kinds.push(b.without_amx());
    }
    kinds
}

/// The AMX kernels where the host has them (and Linux grants the tiles).
fn amx_kernel() -> Option<Bf16Isa> {
    let best = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = Bf16Isa::new(best);
    if !b.amx() {
        println!("no AMX here: only the AVX-512 BF16 kernels and the scalar twins ran");
    }
    b.amx().then_some(b)
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
        for hd in [1usize, 2, 3, 6, 33, 64, 128, 256] {
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

/// Values over a wide range of magnitudes (`wide`) or in ±2.
fn operands(rng: &mut impl Rng, n: usize, wide: bool) -> Vec<u32> {
    let x: Vec<f32> = (0..2 * n)
        .map(|_| {
            let e = if wide { rng.random_range(-20..12) } else { 1 };
            rng.random_range(-1.0f32..1.0) * 2f32.powi(e)
        })
        .collect();
    let mut out = vec![0u32; n];
    bf16::pack_in_order(Bf16Isa::scalar(), &x, &mut out);
    out
}

/// Pairs with their signs cleared: the same chains over them bound the
/// magnitude of every partial sum.
fn abs(x: &[u32]) -> Vec<u32> {
    x.iter().map(|x| x & 0x7fff_7fff).collect()
}

/// `got` within `2⁻¹⁶ · bound` of `want`: the sums' own roundings in
/// another order (at most ~130 roundings of 2⁻²⁴ of a partial sum, each
/// partial sum at most `bound`).
fn close(got: &[f32], want: &[f32], bound: &[f32], what: &str) -> f32 {
    let mut worst = 0.0f32;
    for ((g, w), m) in got.iter().zip(want).zip(bound) {
        let err = (g - w).abs();
        assert!(
            err <= m * 2f32.powi(-16),
            "{what}: {g} against {w} (bound {m})"
        );
        if *m > 0.0 {
            worst = worst.max(err / m);
        }
    }
    worst
}

/// AMX's `tdpbf16ps` rounds the sums its own way: not as `vdpbf16ps`
/// (`bf16::dot2`, odd product first, each sum rounded), nor as a pair's
/// exact sum rounded once (measured on Emerald Rapids: about half the
/// results of sixteen pairs differ in the last bits). Its scores and
/// weighted sums are the chains' within the f32 rounding of sums of that
/// length, on the same BF16 inputs, for query counts around its tiles of
/// sixteen rows and head sizes it takes (and those it leaves to
/// `vdpbf16ps`).
#[test]
fn amx_products_are_the_chains_within_f32_rounding() {
    let Some(b) = amx_kernel() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
    let mut worst = 0.0f32;
    for wide in [false, true] {
        for hd in [33usize, 64, 256] {
            let pairs = hd.div_ceil(2);
            let keys = operands(&mut rng, 2 * KEY_TILE * pairs, wide);
            let values = operands(&mut rng, KEY_BLOCK / 2 * hd, wide);
            for n in QUERIES {
                let q_pairs = operands(&mut rng, n * pairs, wide);
                let (mut qb, mut part) = (Vec::new(), Vec::new());
                pack_bf16(&q_pairs, n, pairs, &mut qb);
                let mut got = vec![0.0; n * KEY_BLOCK];
                scores_bf16(b, &qb, (n, pairs), &keys, 0.3, &mut part, &mut got);
                let (mut want, mut bound) = ([0.0; KEY_BLOCK], [0.0; KEY_BLOCK]);
                for qi in 0..n {
                    let q = &q_pairs[qi * pairs..(qi + 1) * pairs];
                    bf16::scores_scalar(q, &keys, 0.3, &mut want);
                    bf16::scores_scalar(&abs(q), &abs(&keys), 0.3, &mut bound);
                    let got = &got[qi * KEY_BLOCK..(qi + 1) * KEY_BLOCK];
                    let what = format!("wide {wide} hd {hd} n {n} scores of {qi}");
                    worst = worst.max(close(got, &want, &bound, &what));
                }
                let p = operands(&mut rng, n * KEY_BLOCK / 2, wide);
                let acc0: Vec<f32> = random(&mut rng, n * hd);
                let mut acc = acc0.clone();
                weighted_bf16(b, &p, (n, hd), &values, &mut acc);
                for qi in 0..n {
                    let row = qi * hd..(qi + 1) * hd;
                    let ps = [&p[qi * KEY_BLOCK / 2..(qi + 1) * KEY_BLOCK / 2]];
                    let mut want = acc0[row.clone()].to_vec();
                    bf16::weighted_sum(Bf16Isa::scalar(), &ps, &values, &mut want);
                    let mut bound: Vec<f32> = acc0[row.clone()].iter().map(|x| x.abs()).collect();
                    let abs_p = abs(ps[0]);
                    bf16::weighted_sum(Bf16Isa::scalar(), &[&abs_p], &abs(&values), &mut bound);
                    let what = format!("wide {wide} hd {hd} n {n} sums of {qi}");
                    worst = worst.max(close(&acc[row], &want, &bound, &what));
                }
            }
        }
    }
    println!("AMX against the chains: worst error {worst:e} of the bound");
}

/// `--attention-precision bf16-prompt` (and `bf16x3`, its split
/// operands): BF16 products on AMX tiles for a prompt's rows in a chunk
/// of any length where AMX takes the head size, f32 for a decode or
/// verify step's rows and for every row where AMX (or a head size it
/// takes) is missing; `bf16` keeps BF16 for every row, off AMX outside
/// prompts.
#[test]
fn bf16_for_prompts_only_is_f32_outside_amx_prompt_rows() {
    let isas = Isa::supported().into_iter();
    for (isa, split) in isas.flat_map(|isa| [(isa, false), (isa, true)]) {
        let b = Bf16Isa::new(CheckedIsa::at_most(isa));
        let prompt_only = if split {
            Products::Bf16(b.split_for_prompts())
        } else {
            Products::Bf16(b.for_prompts_only())
        };
        for hd in [64, 256] {
            let step = for_rows(prompt_only, false, hd);
            assert_eq!(step, (Products::F32, None), "{isa:?} {hd}");
            let every = for_rows(Products::Bf16(b), false, hd);
            let off_amx = (Products::Bf16(b.without_amx()), None);
            assert_eq!(every, off_amx, "{isa:?} {hd}");
            let prompt = for_rows(prompt_only, true, hd);
            if b.amx() {
                assert_eq!(prompt, (prompt_only, Some(amx_rows())), "{isa:?} {hd}");
            } else {
                assert_eq!(prompt, (Products::F32, None), "{isa:?} {hd}");
            }
        }
        // A head size that is not whole tile columns of sixteen pairs.
        let odd = for_rows(prompt_only, true, 48);
        assert_eq!(odd, (Products::F32, None), "{isa:?}");
    }
}
