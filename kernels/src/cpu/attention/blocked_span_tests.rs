//! The span fold on AMX against a float64 softmax of the same BF16
//! inputs, over several spans (so later spans raise some queries'
//! maxima), and where spans stop.

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::Isa;

/// `x` rounded to BF16 and back: the inputs every product reads.
fn bf16_exact(x: f32) -> f32 {
    f32::from_bits(u32::from(bf16::round(x)) << 16)
}

fn random(rng: &mut impl Rng, n: usize, spread: f32) -> Vec<f32> {
    (0..n)
        .map(|_| bf16_exact(rng.random_range(-spread..spread)))
        .collect()
}

#[test]
fn spans_stop_at_fixed_positions_the_end_and_a_segment() {
    let span = span_blocks() * KEY_BLOCK;
    // Deep in a segment: a whole span.
    assert_eq!(stop(0, 5000, 1024), span);
    // A walk that starts inside a span stops where the span does, not a
    // span's length later: the cuts do not depend on the tile.
    assert_eq!(stop(KEY_BLOCK, 5000, 1024), span);
    assert_eq!(stop(span + 3 * KEY_BLOCK, 5000, 1024), 2 * span);
    // The last span ends with the block that holds the last row.
    assert_eq!(stop(span, span + 44, 1024), span + 2 * KEY_BLOCK);
    assert_eq!(stop(span, span + 64, 1024), span + 2 * KEY_BLOCK);
    // Never across a segment boundary (a windowed layer's are shorter).
    assert_eq!(stop(0, 5000, 4 * KEY_BLOCK), 4 * KEY_BLOCK.min(span));
}

#[test]
fn spans_fold_to_the_softmax_of_the_bf16_products() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = Bf16Isa::new(isa);
    if !b.amx() {
        println!("no AMX here: the span fold does not run (takes() is false)");
        assert!(!takes(b, 256));
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4141);
    let mut worst = 0.0f64;
    for (hd, n, spans) in [
        (64usize, 16usize, [3usize, 1]),
        (256, 128, [8, 5]),
        (128, 48, [2, 8]),
        // A short chunk's queries, padded to whole tiles.
        (256, 20, [1, 2]),
    ] {
        let blocks: usize = spans.iter().sum();
        let positions = blocks * KEY_BLOCK;
        let q = random(&mut rng, n * hd, 1.0);
        let k = random(&mut rng, positions * hd, 1.0);
        let v = random(&mut rng, positions * hd, 1.0);
        // Later keys larger, so a later span raises the running maxima.
        let k: Vec<f32> = k
            .iter()
            .enumerate()
            .map(|(i, x)| bf16_exact(x * (1.0 + (i / hd) as f32 / positions as f32)))
            .collect();
        let scale = 0.25;
        let padded = n.next_multiple_of(QUERY_ROWS);
        let mut q_pairs = vec![0u32; padded * hd / 2];
        for qi in 0..n {
            let to = &mut q_pairs[qi * hd / 2..(qi + 1) * hd / 2];
            bf16::pack_in_order(b, &q[qi * hd..(qi + 1) * hd], to);
        }
        let (mut max, mut sum) = (vec![f32::NEG_INFINITY; n], vec![0.0f32; n]);
        let mut acc = vec![0.0f32; padded * hd];
        let mut span = Span::default();
        let mut first = 0;
        for len in spans {
            span.clear();
            for w in first..first + len {
                // `Tile::block`'s layout: two key tiles dimension-major,
                // then the values row by row.
                let mut keys = vec![0.0f32; KEY_BLOCK * hd];
                for j in 0..KEY_BLOCK {
                    for d in 0..hd {
                        let (t, lane) = (j / KEY_TILE, j % KEY_TILE);
                        keys[t * KEY_TILE * hd + d * KEY_TILE + lane] =
                            k[(w * KEY_BLOCK + j) * hd + d];
                    }
                }
                let values = &v[w * KEY_BLOCK * hd..(w + 1) * KEY_BLOCK * hd];
                span.push(b, hd, &keys, values);
            }
            let queries = SpanQueries {
                q: &q_pairs,
                n,
                head_dim: hd,
                scale,
                softcap: None,
            };
            let every = |_| 0..len * KEY_BLOCK;
            span.fold(isa, b, &queries, every, (&mut max, &mut sum, &mut acc));
            first += len;
        }
        for qi in 0..n {
            let s: Vec<f64> = (0..positions)
                .map(|j| {
                    let dot: f64 = (0..hd)
                        .map(|d| f64::from(q[qi * hd + d]) * f64::from(k[j * hd + d]))
                        .sum();
                    dot * f64::from(scale)
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let total: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..positions)
                    .map(|j| e[j] * f64::from(v[j * hd + d]))
                    .sum::<f64>()
                    / total;
                let got = f64::from(acc[qi * hd + d] / sum[qi]);
                let err = (got - want).abs();
                worst = worst.max(err);
                // Probabilities rounded to BF16 (8 bits) on values in ±1.
                assert!(
                    err <= 4e-3,
                    "hd {hd} n {n} query {qi} dim {d}: {got} against {want}"
                );
            }
        }
    }
    println!("span fold against float64: worst error {worst:e}");
}

/// A block packed straight from an F16 run has the bits of the run
/// widened to f32 and packed (`Span::push`).
#[test]
fn an_f16_run_packs_to_the_bits_of_its_widened_copy() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = Bf16Isa::new(isa);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4142);
    for hd in [16usize, 64, 256] {
        let run: Vec<half::f16> = (0..2 * KEY_BLOCK * hd)
            .map(|_| half::f16::from_f32(rng.random_range(-3.0..3.0)))
            .collect();
        let wide: Vec<f32> = run.iter().map(|x| x.to_f32()).collect();
        let (keys, values) = wide.split_at(KEY_BLOCK * hd);
        let (mut direct, mut widened) = (Span::default(), Span::default());
        if !direct.push_f16(b, hd, &run) {
            println!("no AVX-512 BF16 here: F16 runs are widened first");
            assert!(!b.simd());
            return;
        }
        widened.push(b, hd, keys, values);
        assert_eq!(direct.keys, widened.keys, "keys, hd {hd}");
        assert_eq!(direct.values, widened.values, "values, hd {hd}");
    }
}
