//! Split operands (`bf16x3`): the packers' SIMD kernels against their
//! scalar twins, the parts against the values they split, and a prompt's
//! rows on AMX against the float64 reference on the unrounded inputs,
//! within a tolerance written out below, a few times the f32 path's.

use rand::SeedableRng;

use super::bf16x3::{self, Rows, TERMS};
use super::window_tests::{attend, attend_chunk, random, shape, Sequence, WINDOW_ABS_TOL};
use super::*;
use crate::cpu::kv_cache::CpuKvCache;
use crate::cpu::kv_layout::KEY_TILE;
use crate::cpu::Isa;
use crate::kv::KvFormat;

/// The f32 path's tolerance plus the splits' error. A split keeps `x` to
/// a relative 2⁻¹⁷ (BF16's rounding of `lo`, at most 2⁻⁹ of it, and `lo`
/// at most 2⁻⁹ of `x`), so a score is off by at most 2⁻¹⁷ of the sum of
/// its terms' magnitudes (`scale · Σ|q_d·k_d|`: 2⁻¹⁷ · 144 = 1.1e-3 at
/// most for these inputs, about √256 · 2⁻¹⁸ · 2.25 / 16 = 8.6e-6 for
/// random signs), a weight by that relatively, and each probability by
/// 2⁻¹⁷ more; an output (values in ±1, a convex combination) by about
/// the same. The worst error seen is printed; 2⁻¹³ leaves room for sums
/// whose errors line up, and is 16 times below BF16's 2⁻⁹.
const BF16X3_ABS_TOL: f32 = WINDOW_ABS_TOL + 1.0 / 8192.0;

fn words(pairs: &[u32]) -> Vec<f32> {
    pairs
        .iter()
        .flat_map(|p| [*p as u16, (*p >> 16) as u16])
        .map(|w| f32::from_bits(u32::from(w) << 16))
        .collect()
}

fn best() -> CheckedIsa {
    CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar))
}

#[test]
fn the_split_packers_give_their_scalar_twins_bits_and_the_parts_sum_to_the_value() {
    let simd = bf16::Bf16Isa::new(best()).split_for_prompts();
    let scalar = bf16::Bf16Isa::scalar().split_for_prompts();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let hd = 256;
    // A query: `[hi | hi | lo]`, hi + lo within 2⁻¹⁷ of each element.
    let q = random(&mut rng, hd, 3.0);
    let pack = |b, q: &[f32]| {
        let mut to = vec![0u32; TERMS * hd / 2];
        bf16x3::pack_query(b, q, &mut to);
        to
    };
    let (a, s) = (pack(simd, &q), pack(scalar, &q));
    assert_eq!(a, s, "pack_query: SIMD and scalar differ");
    let w = words(&a);
    let (hi, hi2, lo) = (&w[..hd], &w[hd..2 * hd], &w[2 * hd..]);
    assert_eq!(hi, hi2);
    for d in 0..hd {
        let err = (hi[d] + lo[d] - q[d]).abs();
        assert!(err <= q[d].abs() * 2f32.powi(-17), "dimension {d}: {err:e}");
        assert!(
            lo[d].abs() <= q[d].abs() * 2f32.powi(-8),
            "dimension {d}: lo {}",
            lo[d]
        );
    }
    // Probabilities of two blocks: each block's sixteen pairs in three.
    let p: Vec<f32> = random(&mut rng, 2 * KEY_BLOCK, 1.0)
        .iter()
        .map(|x| x.abs())
        .collect();
    let pack = |b| {
        let mut to = vec![0u32; TERMS * KEY_BLOCK];
        bf16x3::pack_probabilities(b, &p, &mut to);
        to
    };
    let (a, s) = (pack(simd), pack(scalar));
    assert_eq!(a, s, "pack_probabilities: SIMD and scalar differ");
    let w = words(&a);
    for (blk, w) in w.chunks_exact(TERMS * KEY_BLOCK).enumerate() {
        for j in 0..KEY_BLOCK {
            let (h, h2, l) = (w[j], w[KEY_BLOCK + j], w[2 * KEY_BLOCK + j]);
            let x = p[blk * KEY_BLOCK + j];
            assert_eq!(h, h2);
            assert!((h + l - x).abs() <= x * 2f32.powi(-17), "probability {j}");
        }
    }
    // A key tile and a block's values, from f32 and from F16: pair rows
    // `[hi | lo | hi]`; an F16 element splits exactly.
    for (row, n) in [(KEY_TILE, KEY_TILE * hd), (hd, KEY_BLOCK * hd)] {
        let x = random(&mut rng, n, 3.0);
        let x16: Vec<half::f16> = x.iter().map(|v| half::f16::from_f32(*v)).collect();
        for (name, src) in [("f32", Rows::F32(&x)), ("f16", Rows::F16(&x16))] {
            let pack = |b| {
                let mut to = vec![0u32; TERMS * n / 2];
                bf16x3::pack_rows(b, src, row, &mut to);
                to
            };
            let (a, s) = (pack(simd), pack(scalar));
            assert!(
                a == s,
                "pack_rows {name} of rows of {row}: SIMD and scalar differ"
            );
            let w = words(&a);
            let (hi, lo, hi2) = (&w[..n], &w[n..2 * n], &w[2 * n..]);
            assert_eq!(hi, hi2);
            for k in 0..n {
                // Pair row m's word 2i + e is element (2m + e)·row + i.
                let (m, i, e) = (k / (2 * row), k / 2 % row, k % 2);
                let at = (2 * m + e) * row + i;
                let v = match src {
                    Rows::F32(x) => x[at],
                    Rows::F16(x) => x[at].to_f32(),
                };
                let err = (hi[k] + lo[k] - v).abs();
                let tol = if name == "f16" {
                    0.0
                } else {
                    v.abs() * 2f32.powi(-17)
                };
                assert!(err <= tol, "{name} rows of {row}, element {at}: {err:e}");
            }
        }
    }
}

/// A prompt fed in chunks (one of one row) on AMX under `bf16x3`, in a
/// layer with a window and one without, F16 and f32 caches, one and three
/// threads: every row within [`BF16X3_ABS_TOL`] of the float64 attention
/// over the inputs as the cache stores them (unrounded to BF16).
#[test]
fn bf16x3_prompt_rows_on_amx_match_the_float64_reference() {
    let chunks = [130usize, 200, 1, 300];
    for (case, (window, dtype)) in [
        (None, KvType::F16),
        (Some(300), KvType::F16),
        (None, KvType::F32),
    ]
    .into_iter()
    .enumerate()
    {
        check_against_float64(900 + case as u64, window, dtype, &chunks, 0, &[1, 3]);
    }
}

/// The same deep in a context: the last 64 rows of a prompt of 3,000
/// (past two segments of 1,024 and many spans), fed as a prefix and a
/// tail.
#[test]
fn bf16x3_rows_deep_in_a_prompt_match_the_float64_reference() {
    check_against_float64(950, None, KvType::F16, &[2936, 64], 2936, &[3]);
}

/// Feeds a random prompt of Gemma 3's heads in `chunks` under `bf16x3`
/// and compares its rows from `from` with the float64 attention.
fn check_against_float64(
    seed: u64,
    window: Option<usize>,
    dtype: KvType,
    chunks: &[usize],
    from: usize,
    threads: &[usize],
) {
    let isa = best();
    let b = bf16::Bf16Isa::new(isa);
    if !b.amx() {
        println!("no AMX here: bf16x3 is f32 for every row (still checked)");
    }
    let products = Products::Bf16(b.split_for_prompts());
    // Gemma 3 270M's heads: four query heads on one KV head of 256.
    let heads @ (n_heads, n_kv_heads, head_dim) = (4, 1, 256);
    let total: usize = chunks.iter().sum();
    let shape = shape(heads, window);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let seq = Sequence::random(&mut rng, dtype, total, heads);
    let (q_cols, kv_cols) = (seq.q_cols, seq.kv_cols);
    for &threads in threads {
        let pool = ThreadPool::new(threads);
        let kv = KvFormat::new(dtype, 64);
        let mut cache = CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, total, &[window])
            .expect("an unlimited pool holds the cache");
        let mut out = Vec::new();
        let mut start = 0;
        for &n in chunks {
            let call = (shape, products);
            out.extend(attend_chunk(
                (&pool, isa),
                &mut cache,
                call,
                (&seq, true),
                (start, n),
            ));
            start += n;
        }
        let mut worst = 0.0f32;
        for p in from..total {
            let seen = window.map_or(0, |w| (p + 1).saturating_sub(w))..p + 1;
            let at_pos = |pos: usize| pos * kv_cols..(pos + 1) * kv_cols;
            let keys: Vec<&[f32]> = seen.clone().map(|pos| &seq.k[at_pos(pos)]).collect();
            let values: Vec<&[f32]> = seen.map(|pos| &seq.v[at_pos(pos)]).collect();
            for h in 0..n_heads {
                let at = p * q_cols + h * head_dim;
                let q = &seq.q[at..at + head_dim];
                let want = attend(q, &keys, &values, shape, |x| x);
                for (got, w) in out[at..at + head_dim].iter().zip(&want) {
                    worst = worst.max((got - w).abs());
                    assert!(
                        (got - w).abs() <= BF16X3_ABS_TOL,
                        "{dtype:?} window {window:?} t{threads} position {p} head {h}: {got} vs {w}"
                    );
                }
            }
        }
        println!(
            "{dtype:?} window {window:?} t{threads} rows {from}..{total}: worst error {worst:e}"
        );
    }
}
