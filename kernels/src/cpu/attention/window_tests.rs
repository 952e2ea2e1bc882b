//! Sliding-window attention over a ring of slots, and capped scores,
//! against a direct scalar computation over the window's keys; and the
//! ring against a cache that keeps every position (bit-identical: a row's
//! arithmetic does not depend on where its keys live).

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::kv_cache::CpuKvCache;
use crate::cpu::Isa;
use crate::kv::KvFormat;

/// As `tests::STREAM_ABS_TOL`: the same scores and sums in another order,
/// plus `tanh` on both sides (f32 against f64, a few 1e-7).
pub(super) const WINDOW_ABS_TOL: f32 = 3e-6;
/// BF16 products against the reference on the same BF16 queries, keys
/// and values: the probabilities' rounding (relative 2⁻⁹ on each weight of
/// the output's numerator; values in ±1) on top of the f32 tolerance.
const WINDOW_BF16_ABS_TOL: f32 = WINDOW_ABS_TOL + 1.0 / 512.0;

/// `x` rounded to BF16, as the BF16 products read it.
fn to_bf16(x: f32) -> f32 {
    f32::from_bits(u32::from(bf16::round(x)) << 16)
}

pub(super) fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

/// `x` as a cache of `dtype` stores it (so that the f64 reference sees
/// the keys and values the kernel reads).
pub(super) fn stored(dtype: KvType, x: Vec<f32>) -> Vec<f32> {
    match dtype {
        KvType::F32 => x,
        KvType::F16 => x
            .into_iter()
            .map(|v| half::f16::from_f32(v).to_f32())
            .collect(),
        // Groups of 32 in a row: a head's when head_dim is a multiple of 32.
        KvType::Q8_0 => crate::cpu::kv_q8::round_q8(&x),
    }
}

/// One query over `keys`/`values` of the positions it sees, in f64.
pub(super) fn attend(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    shape: AttentionShape,
    round: fn(f32) -> f32,
) -> Vec<f32> {
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| {
            let s = q
                .iter()
                .zip(*k)
                .map(|(a, b)| round(*a) as f64 * round(*b) as f64)
                .sum::<f64>()
                * shape.scale as f64;
            shape
                .softcap
                .map_or(s, |c| c as f64 * (s / c as f64).tanh())
        })
        .collect();
    let max = scores.iter().fold(f64::NEG_INFINITY, |m, s| m.max(*s));
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..q.len())
        .map(|d| {
            let v: f64 = weights
                .iter()
                .zip(values)
                .map(|(w, v)| w * round(v[d]) as f64)
                .sum();
            (v / total) as f32
        })
        .collect()
}

/// A whole sequence's queries, keys and values (rows of `q_cols` and
/// `kv_cols`), from which a test feeds chunks.
pub(super) struct Sequence {
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) q_cols: usize,
    pub(super) kv_cols: usize,
}

/// Heads `(n_heads, n_kv_heads, head_dim)` with `window`, scaled by
/// `1 / √head_dim`, scores uncapped.
pub(super) fn shape(
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    window: Option<usize>,
) -> AttentionShape {
    AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
        softcap: None,
    }
}

impl Sequence {
    /// `rows` random rows of `n_heads` query and `n_kv_heads` KV heads of
    /// `head_dim`: queries and keys in ±3 (scores up to a few units, so
    /// later blocks raise the running maxima), values in ±1, keys and
    /// values as a cache of `dtype` stores them.
    pub(super) fn random(
        rng: &mut impl Rng,
        dtype: KvType,
        rows: usize,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    ) -> Sequence {
        let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
        Sequence {
            q: random(rng, rows * q_cols, 3.0),
            k: stored(dtype, random(rng, rows * kv_cols, 3.0)),
            v: stored(dtype, random(rng, rows * kv_cols, 1.0)),
            q_cols,
            kv_cols,
        }
    }
}

/// Rows `start..start + n` of `seq` through one attention call on layer 0
/// of `cache` (a prompt's rows where `prompt`: `AttentionRows::prompt`):
/// the chunk's outputs.
pub(super) fn attend_chunk(
    (pool, isa): (&ThreadPool, CheckedIsa),
    cache: &mut CpuKvCache,
    (shape, products): (AttentionShape, Products),
    (seq, prompt): (&Sequence, bool),
    (start, n): (usize, usize),
) -> Vec<f32> {
    let act = |data: &[f32], cols: usize| CpuActivations {
        rows: n,
        cols,
        data: data[start * cols..(start + n) * cols].to_vec(),
    };
    let (q, k, v) = (
        act(&seq.q, seq.q_cols),
        act(&seq.k, seq.kv_cols),
        act(&seq.v, seq.kv_cols),
    );
    let call = AttentionCall {
        layer: 0,
        shape,
        q: &q,
        k: &k,
        v: &v,
        products,
    };
    let mut out = CpuActivations::zeros(n, seq.q_cols);
    let (store, rows) = cache.rows(0..n, start, prompt).expect("the cache's blocks");
    attention(pool, isa, call, store, &[rows], &mut out)
        .expect("attention over an allocated cache");
    out.data
}

#[test]
fn a_ring_of_slots_attends_over_the_window_like_the_whole_cache() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let (n_heads, n_kv_heads, head_dim, window) = (4, 2, 24, 40);
    for (softcap, dtype, bf16) in [
        (None, KvType::F32, false),
        (Some(5.0f32), KvType::F32, false),
        (None, KvType::F16, false),
        (Some(5.0f32), KvType::F16, false),
        (None, KvType::F16, true),
        (Some(5.0f32), KvType::F32, true),
    ] {
        let (round, tol): (fn(f32) -> f32, f32) = if bf16 {
            (to_bf16, WINDOW_BF16_ABS_TOL)
        } else {
            (|x| x, WINDOW_ABS_TOL)
        };
        let shape = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: Some(window),
            softcap,
        };
        // A prompt longer than the ring (pieces), decode steps, a chunk.
        let chunks = [300usize, 1, 1, 20, 1, 150];
        let total: usize = chunks.iter().sum();
        let capacity = total + 7;
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let products = if bf16 {
                Products::Bf16(bf16::Bf16Isa::new(isa))
            } else {
                Products::F32
            };
            let pool = ThreadPool::new(2);
            // Blocks of 64 positions: the ring is three (192 positions)
            // and turns twice.
            let kv = KvFormat::new(dtype, 64);
            let mut ring =
                CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, capacity, &[Some(window)])
                    .expect("an unlimited pool holds the ring");
            let mut whole = CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, capacity, &[])
                .expect("an unlimited pool holds the whole cache");
            assert!(ring.layout().bytes_beyond(0) < whole.layout().bytes_beyond(0));
            let seq = Sequence::random(&mut rng, dtype, total, (n_heads, n_kv_heads, head_dim));
            let (q_cols, kv_cols) = (seq.q_cols, seq.kv_cols);
            let (q_all, k_all, v_all) = (&seq.q, &seq.k, &seq.v);
            let mut start = 0;
            for n in chunks {
                let outs: Vec<Vec<f32>> = [&mut ring, &mut whole]
                    .into_iter()
                    .map(|cache| {
                        attend_chunk(
                            (&pool, isa),
                            cache,
                            (shape, products),
                            (&seq, true),
                            (start, n),
                        )
                    })
                    .collect();
                assert_eq!(
                    outs[0], outs[1],
                    "{isa:?} {dtype} chunk at {start}: ring against whole cache"
                );
                for i in 0..n {
                    let p = start + i;
                    let seen = (p + 1).saturating_sub(window)..p + 1;
                    for h in 0..n_heads {
                        let kv = h / (n_heads / n_kv_heads);
                        let span = |pos: usize| {
                            pos * kv_cols + kv * head_dim..pos * kv_cols + (kv + 1) * head_dim
                        };
                        let keys: Vec<&[f32]> = seen.clone().map(|pos| &k_all[span(pos)]).collect();
                        let values: Vec<&[f32]> =
                            seen.clone().map(|pos| &v_all[span(pos)]).collect();
                        let at = (start + i) * q_cols + h * head_dim;
                        let want = attend(&q_all[at..at + head_dim], &keys, &values, shape, round);
                        let got = &outs[0][i * q_cols + h * head_dim..][..head_dim];
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= tol,
                                "{isa:?} {dtype} cap {softcap:?} bf16 {bf16} position {p} head {h}: {g} vs {w}"
                            );
                        }
                    }
                }
                start += n;
            }
            // Only the ring's blocks were ever allocated.
            assert!(ring.allocated_bytes() <= ring.layout().bytes_beyond(0));
            assert!(ring.allocated_bytes() < whole.allocated_bytes());
        }
    }
}

#[test]
fn a_ring_refuses_a_call_without_its_window() {
    let pool = ThreadPool::new(1);
    let shape = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    let x = CpuActivations::zeros(1, 4);
    let mut out = CpuActivations::zeros(1, 4);
    let kv = KvFormat::of(KvType::F32);
    let mut cache = CpuKvCache::windowed(&kv, 1, 1, 4, 1000, &[Some(8)])
        .expect("an unlimited pool holds the ring");
    let call = AttentionCall {
        layer: 0,
        shape,
        q: &x,
        k: &x,
        v: &x,
        products: Products::F32,
    };
    let (store, seq) = cache.rows(0..1, 0, false).expect("the ring's blocks");
    let isa = CheckedIsa::at_most(Isa::Scalar);
    assert!(attention(&pool, isa, call, store, &[seq], &mut out).is_err());
}

/// A prompt chunk of a windowed layer on AMX (`blocked::for_rows`: tiles
/// of 32 rows; blocks in spans at fixed positions, the lanes a row does
/// not see, before its window or past its position, weighed 0): within the BF16 tolerance of the f64 reference on
/// the BF16 inputs, and within twice the probabilities' rounding
/// (2 · 2⁻⁹, as `tests::bf16_prompt_chunks_on_amx_match_the_reference`)
/// of the same calls on `vdpbf16ps`. Gemma 3's heads; windows that end
/// inside a block and on a block's edge; chunks from the start, across
/// the window and after the ring turned, at one and three threads.
#[test]
fn windowed_prompt_chunks_on_amx_match_the_reference() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = bf16::Bf16Isa::new(isa);
    if !b.amx() {
        println!("no AMX here: the BF16 kernels run on vdpbf16ps or their scalar twins");
    }
    let (n_heads, n_kv_heads, head_dim) = (4, 1, 256);
    let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
    for (w, window) in [300usize, 512].into_iter().enumerate() {
        let shape = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: Some(window),
            softcap: None,
        };
        // Every chunk's rows take AMX (the one of one row too); the third
        // starts after the ring (the window and `RING_SLACK`) has turned.
        let chunks = [130usize, 200, 128, 1, 160];
        let total: usize = chunks.iter().sum();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(700 + w as u64);
        let seq = Sequence {
            q: random(&mut rng, total * q_cols, 3.0),
            k: stored(KvType::F16, random(&mut rng, total * kv_cols, 3.0)),
            v: stored(KvType::F16, random(&mut rng, total * kv_cols, 1.0)),
            q_cols,
            kv_cols,
        };
        let (q_all, k_all, v_all) = (&seq.q, &seq.k, &seq.v);
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            let mut outs = Vec::new();
            for products in [b, b.without_amx()] {
                let kv = KvFormat::new(KvType::F16, 64);
                let mut ring =
                    CpuKvCache::windowed(&kv, 1, n_kv_heads, head_dim, total, &[Some(window)])
                        .expect("an unlimited pool holds the ring");
                let mut all = Vec::new();
                let mut start = 0;
                for n in chunks {
                    let products = Products::Bf16(products);
                    let shape = (shape, products);
                    all.extend(attend_chunk(
                        (&pool, isa),
                        &mut ring,
                        shape,
                        (&seq, true),
                        (start, n),
                    ));
                    start += n;
                }
                outs.push(all);
            }
            let mut worst = 0.0f32;
            for p in 0..total {
                let seen = (p + 1).saturating_sub(window)..p + 1;
                let span = |pos: usize| pos * kv_cols..(pos + 1) * kv_cols;
                let keys: Vec<&[f32]> = seen.clone().map(|pos| &k_all[span(pos)]).collect();
                let values: Vec<&[f32]> = seen.clone().map(|pos| &v_all[span(pos)]).collect();
                for h in 0..n_heads {
                    let at = p * q_cols + h * head_dim;
                    let want = attend(&q_all[at..at + head_dim], &keys, &values, shape, to_bf16);
                    let amx = &outs[0][at..at + head_dim];
                    let simd = &outs[1][at..at + head_dim];
                    for ((a, s), w) in amx.iter().zip(simd).zip(&want) {
                        worst = worst.max((a - w).abs());
                        assert!(
                            (a - w).abs() <= WINDOW_BF16_ABS_TOL,
                            "window {window} t{threads} position {p} head {h}: AMX {a} vs {w}"
                        );
                        assert!(
                            (a - s).abs() <= 2.0 * 2f32.powi(-9),
                            "window {window} t{threads} position {p} head {h}: AMX {a} vs {s}"
                        );
                    }
                }
            }
            println!("window {window} t{threads}: AMX against float64, worst error {worst:e}");
        }
    }
}
