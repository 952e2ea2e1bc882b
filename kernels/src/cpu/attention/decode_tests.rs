//! The decode kernel (`decode::fold_row`) against the per-row path it
//! replaces for one row: the run widened to f32, `scores16_group`,
//! `online_step`, the rescale and `weighted_sum_group`, [`GROUP_MAX`]
//! heads at a time. Every state must come out bit for bit the same, for
//! f16 and f32 runs, groups of one to six heads, whole and partial
//! blocks (a decode step's last block, a window's first), from an empty
//! state and from one a block raises or does not raise.

use std::ops::Range;

use half::f16;
use rand::{Rng, SeedableRng};

use super::decode::{fast, fold_row, RowState};
use super::online::online_step;
use super::scores::{scores16_group, GROUP_MAX};
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::{widen_f16, Direct};
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};
use crate::cpu::vecmath::{scale_in_place, weighted_sum_group};
use crate::cpu::Isa;

/// One row's states for `g` heads of `hd`.
#[derive(Clone, PartialEq, Debug)]
struct States {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl States {
    fn bits(&self) -> Vec<u32> {
        self.max
            .iter()
            .chain(&self.sum)
            .chain(&self.acc)
            .map(|x| x.to_bits())
            .collect()
    }
}

/// The per-row path of `stream` for one row against an f32 run.
fn per_row(
    isa: CheckedIsa,
    run: &[f32],
    qs: &[&[f32]],
    scale: f32,
    lanes: Range<usize>,
    s: &mut States,
) {
    let hd = qs[0].len();
    let (keys, values) = run.split_at(KEY_BLOCK * hd);
    let n = lanes.end;
    for h0 in (0..qs.len()).step_by(GROUP_MAX) {
        let g = (qs.len() - h0).min(GROUP_MAX);
        let mut scores = [[0.0f32; KEY_BLOCK]; GROUP_MAX];
        let mut tile = [[0.0f32; KEY_TILE]; GROUP_MAX];
        for t in 0..n.div_ceil(KEY_TILE) {
            let at = t * KEY_TILE * hd;
            let keys = &keys[at..at + KEY_TILE * hd];
            scores16_group(isa, &qs[h0..h0 + g], keys, scale, &mut tile);
            for h in 0..g {
                scores[h][t * KEY_TILE..(t + 1) * KEY_TILE].copy_from_slice(&tile[h]);
            }
        }
        // `h` names a head both in the group's scores and in the state.
        #[allow(clippy::needless_range_loop)]
        for h in 0..g {
            let q = h0 + h;
            let (max, sum) = (&mut s.max[q], &mut s.sum[q]);
            if let Some(c) = online_step(isa, &mut scores[h][lanes.clone()], max, sum) {
                scale_in_place(isa, c, &mut s.acc[q * hd..(q + 1) * hd]);
            }
        }
        let ps: Vec<&[f32]> = scores[..g].iter().map(|p| &p[lanes.clone()]).collect();
        let values = &values[lanes.start * hd..n * hd];
        weighted_sum_group(isa, &ps, values, &mut s.acc[h0 * hd..(h0 + g) * hd]);
    }
}

fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

#[test]
fn a_decode_block_is_bit_for_bit_the_per_row_path() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    let mut checked = 0;
    for isa in Isa::supported() {
        let isa = CheckedIsa::at_most(isa);
        for hd in [16usize, 48, 64, 80, 128, 256] {
            if !fast(isa, hd) {
                continue;
            }
            let run = random(&mut rng, 2 * KEY_BLOCK * hd, 2.0);
            let halves: Vec<f16> = run.iter().map(|x| f16::from_f32(*x)).collect();
            let mut widened = vec![0.0f32; halves.len()];
            widen_f16(isa, &halves, &mut widened);
            for g in 1..=6 {
                let queries: Vec<Vec<f32>> = (0..g).map(|_| random(&mut rng, hd, 2.0)).collect();
                let qs: Vec<&[f32]> = queries.iter().map(|q| &q[..]).collect();
                let empty = States {
                    max: vec![f32::NEG_INFINITY; g],
                    sum: vec![0.0; g],
                    acc: vec![0.0; g * hd],
                };
                // A state the block raises (small max) and one it does not.
                let low = States {
                    max: vec![-3.0; g],
                    sum: vec![1.5; g],
                    acc: random(&mut rng, g * hd, 1.0),
                };
                let high = States {
                    max: vec![60.0; g],
                    ..low.clone()
                };
                for lanes in [0..32, 0..1, 0..16, 0..17, 5..32, 7..20, 31..32] {
                    for start in [&empty, &low, &high] {
                        let runs: [(Direct<'_>, &[f32]); 2] =
                            [(Direct::F16(&halves), &widened), (Direct::F32(&run), &run)];
                        for (direct, as_f32) in runs {
                            let mut want = start.clone();
                            per_row(isa, as_f32, &qs, 0.125, lanes.clone(), &mut want);
                            let mut got = start.clone();
                            let state = RowState {
                                max: &mut got.max,
                                sum: &mut got.sum,
                                acc: &mut got.acc,
                            };
                            assert!(fold_row(isa, direct, &qs, 0.125, lanes.clone(), state));
                            assert_eq!(
                                got.bits(),
                                want.bits(),
                                "{isa:?} hd {hd} heads {g} lanes {lanes:?}: {got:?} vs {want:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    // Hosts without AVX-512 have no decode kernel: nothing to compare.
    let simd = Isa::supported().contains(&Isa::Avx512);
    assert!(!simd || checked > 0, "AVX-512 present but nothing checked");
}

#[test]
fn shapes_it_does_not_take_are_left_unchanged() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let hd = 33;
    let run = vec![0.5f32; 2 * KEY_BLOCK * hd];
    let q = vec![1.0f32; hd];
    let (mut max, mut sum, mut acc) = ([1.0f32], [2.0f32], vec![3.0f32; hd]);
    let state = RowState {
        max: &mut max,
        sum: &mut sum,
        acc: &mut acc,
    };
    assert!(!fold_row(isa, Direct::F32(&run), &[&q], 1.0, 0..32, state));
    assert_eq!((max, sum), ([1.0], [2.0]));
    assert!(acc.iter().all(|a| *a == 3.0));
    // Empty lanes and a run too short are refused the same way.
    let short = [0.5f32; 8];
    let q = vec![1.0f32; 16];
    let mut acc = vec![0.0f32; 16];
    for (run, lanes) in [(&run[..], 3..3), (&short[..], 0..32)] {
        let state = RowState {
            max: &mut max,
            sum: &mut sum,
            acc: &mut acc,
        };
        assert!(!fold_row(isa, Direct::F32(run), &[&q], 1.0, lanes, state));
    }
}
