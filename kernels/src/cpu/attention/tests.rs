//! The streaming kernel against the straightforward reference
//! (`reference::attend_one`, with libm's `exp`) on awkward shapes: odd
//! head sizes, one and several query rows starting past position 0, seen
//! lengths around the block size, GQA groups of 1 and 3, several
//! sequences in one call.

use rand::{Rng, SeedableRng};

use super::reference::attend_one;
use super::*;
use crate::cpu::kv_cache::{self, grow};
use crate::cpu::Isa;
use crate::kv::{BlockTable, KvFormat, KvLayout};

/// Outputs are convex combinations of values in ±1. Both kernels compute
/// the same scores (the same dot products), then differ in `exp` (libm
/// against ours, each within an ulp or two), in the order of the sums
/// (one pass against blocks of 32 with rescaling, ~10 roundings of
/// relative 2⁻²⁴ each on a sum of ≤ 300 terms) and in fused against split
/// multiply-adds: a few 1e-7 in all; 2e-6 absolute leaves margin and is
/// still ten times tighter than the engine-level tolerance (2e-5).
const STREAM_ABS_TOL: f32 = 2e-6;
/// BF16 products against the same reference fed the BF16 queries, keys
/// and values: plus the probabilities' rounding (relative 2⁻⁹ on each
/// weight of the numerator; values in ±1), and two score chains instead of
/// one sum (f32 order, within the f32 tolerance).
const STREAM_BF16_ABS_TOL: f32 = STREAM_ABS_TOL + 1.0 / 512.0;

struct Case {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Per sequence: (positions already in the cache, new rows).
    seqs: Vec<(usize, usize)>,
}

fn act_from(rows: usize, cols: usize, data: Vec<f32>) -> CpuActivations {
    CpuActivations { rows, cols, data }
}

fn random(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

/// An attention call on layer 0 of the caches.
fn layer0<'a>(
    shape: AttentionShape,
    q: &'a CpuActivations,
    k: &'a CpuActivations,
    v: &'a CpuActivations,
    products: Products,
) -> AttentionCall<'a> {
    AttentionCall {
        layer: 0,
        shape,
        q,
        k,
        v,
        products,
    }
}

fn to_bf16(x: f32) -> f32 {
    f32::from_bits(u32::from(bf16::round(x)) << 16)
}

/// The reference reads the keys and values back out of the cache, so an
/// F16 cache is checked on what it rounded them to, at the same tolerance.
/// Returns the outputs of the last call (every row of every sequence).
fn check(
    isa: CheckedIsa,
    threads: usize,
    dtype: KvType,
    bf16: Option<bf16::Bf16Isa>,
    case: &Case,
    rng: &mut impl Rng,
) -> Vec<f32> {
    let products = bf16.map_or(Products::F32, Products::Bf16);
    let bf16 = bf16.is_some();
    let (round, tol): (fn(f32) -> f32, f32) = if bf16 {
        (to_bf16, STREAM_BF16_ABS_TOL)
    } else {
        (|x| x, STREAM_ABS_TOL)
    };
    let Case {
        n_heads,
        n_kv_heads,
        head_dim,
        ref seqs,
    } = *case;
    let shape = AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
        softcap: None,
    };
    let pool = ThreadPool::new(threads);
    let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
    let total: usize = seqs.iter().map(|s| s.1).sum();
    // Caches with their earlier positions written through the kernel itself
    // (a prefill call), then one call over every sequence's new rows.
    // Every sequence's blocks in one store, as the engine keeps them.
    let mut store = CpuKvStore::default();
    let mut caches: Vec<BlockTable> = Vec::new();
    for &(before, rows) in seqs {
        let kv = KvFormat::of(dtype);
        let layout = KvLayout::new(kv, 1, n_kv_heads, head_dim, before + rows, &[])
            .expect("a layout of whole heads");
        let mut cache = BlockTable::new(layout);
        grow(&mut store, &mut cache, before + rows).expect("an unlimited store grows");
        if before > 0 {
            let mut act = |cols, range| act_from(before, cols, random(rng, before * cols, range));
            let (q, k, v) = (act(q_cols, 1.0), act(kv_cols, 1.0), act(kv_cols, 1.0));
            let mut out = CpuActivations::zeros(before, q_cols);
            let call = layer0(shape, &q, &k, &v, products);
            let seq = [SeqRows {
                table: &cache,
                rows: 0..before,
                start_pos: 0,
                prompt: true,
            }];
            attention(&pool, isa, call, &mut store, &seq, &mut out)
                .expect("the rows fit the caches and the call\'s shape");
        }
        caches.push(cache);
    }
    // Scores up to ±8·√head_dim·scale·… : large enough that the running
    // maximum moves and blocks rescale.
    let q = act_from(total, q_cols, random(rng, total * q_cols, 3.0));
    let k = act_from(total, kv_cols, random(rng, total * kv_cols, 3.0));
    let v = act_from(total, kv_cols, random(rng, total * kv_cols, 1.0));
    let mut out = CpuActivations::zeros(total, q_cols);
    let mut first = 0;
    let mut rows = Vec::new();
    for &(before, n) in seqs {
        rows.push((first..first + n, before));
        first += n;
    }
    {
        let seq_rows: Vec<SeqRows<'_>> = caches
            .iter()
            .zip(&rows)
            .map(|(table, (rows, before))| SeqRows {
                table,
                rows: rows.clone(),
                start_pos: *before,
                prompt: true,
            })
            .collect();
        let call = layer0(shape, &q, &k, &v, products);
        attention(&pool, isa, call, &mut store, &seq_rows, &mut out)
            .expect("the rows fit the caches and the call\'s shape");
    }
    let group = n_heads / n_kv_heads;
    let mut want = vec![0.0f32; head_dim];
    for (table, (rows, before)) in caches.iter().zip(&rows) {
        // Each KV head's keys and values, read back once per sequence: a row
        // attends over the first `seen` of them.
        let end = before + rows.len();
        let read =
            |store: &mut CpuKvStore,
             kv,
             part: fn(&mut CpuKvStore, &BlockTable, usize, usize, usize) -> Vec<f32>| {
                (0..end)
                    .flat_map(|p| part(store, table, 0, kv, p))
                    .map(round)
                    .collect::<Vec<f32>>()
            };
        let (keys, values): (Vec<_>, Vec<_>) = (0..n_kv_heads)
            .map(|kv| {
                (
                    read(&mut store, kv, kv_cache::key),
                    read(&mut store, kv, kv_cache::value),
                )
            })
            .unzip();
        for (i, row) in rows.clone().enumerate() {
            let seen = before + i + 1;
            for h in 0..n_heads {
                let at = row * q_cols + h * head_dim;
                let query: Vec<f32> = q.data[at..at + head_dim]
                    .iter()
                    .map(|x| round(*x))
                    .collect();
                let kv = h / group;
                let (keys, values) = (&keys[kv][..seen * head_dim], &values[kv][..seen * head_dim]);
                attend_one(&query, keys, values, shape.scale, &mut want);
                let got = &out.data[at..at + head_dim];
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= tol,
                        "{:?} {dtype} bf16 {bf16} t{threads} {n_heads}/{n_kv_heads}×{head_dim} seen {seen} head {h}: {g} vs {w}",
                        isa.get()
                    );
                }
            }
        }
    }
    out.data
}

#[test]
fn streaming_matches_the_reference_on_awkward_shapes() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let cases = [
        // SmolLM2's layout: decode at seen lengths 1, 17, 300 in one call.
        Case {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            seqs: vec![(0, 1), (16, 1), (299, 1)],
        },
        // A prompt chunk of several tiles after earlier positions.
        Case {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            seqs: vec![(40, 19)],
        },
        // No GQA, odd head size, chunks straddling block boundaries.
        Case {
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 7,
            seqs: vec![(31, 3), (0, 17), (63, 2)],
        },
        Case {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 33,
            seqs: vec![(5, 40), (300, 1)],
        },
        Case {
            n_heads: 3,
            n_kv_heads: 1,
            head_dim: 1,
            seqs: vec![(0, 33)],
        },
    ];
    for isa in Isa::supported() {
        for threads in [1, 2, 3] {
            for dtype in [KvType::F32, KvType::F16] {
                for case in &cases {
                    check(
                        CheckedIsa::at_most(isa),
                        threads,
                        dtype,
                        None,
                        case,
                        &mut rng,
                    );
                }
            }
        }
        println!("streaming attention matches the reference on {isa}");
    }
}

/// BF16 products: within their tolerance of the reference on the same
/// BF16 inputs, and bit for bit the same from the AVX-512 BF16 kernels as
/// from their scalar twins (the rest of attention on the same ISA: its
/// `exp` differs between ISAs within an ulp) at every thread count (a
/// split context merges the same segments).
#[test]
fn bf16_products_match_the_reference_and_their_scalar_twins() {
    let cases = [
        Case {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            seqs: vec![(0, 1), (16, 1), (100, 1)],
        },
        // Gemma 3's heads.
        Case {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            seqs: vec![(40, 19), (300, 1)],
        },
        // Past a segment (1,024 positions): split across tasks.
        Case {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 16,
            seqs: vec![(1100, 1), (5, 40)],
        },
        Case {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 33,
            seqs: vec![(5, 40), (31, 3)],
        },
    ];
    for (c, case) in cases.iter().enumerate() {
        for dtype in [KvType::F32, KvType::F16] {
            for isa in Isa::supported() {
                let isa = CheckedIsa::at_most(isa);
                let mut first: Option<Vec<f32>> = None;
                for threads in [1, 3] {
                    // AMX's sums are its own: `bf16_prompt_chunks_on_amx_match_the_reference`.
                    let simd = bf16::Bf16Isa::new(isa).without_amx();
                    for products in [simd, bf16::Bf16Isa::scalar()] {
                        // The same inputs for every thread count and kernel.
                        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(77 + c as u64);
                        let out = check(isa, threads, dtype, Some(products), case, &mut rng);
                        match &first {
                            None => first = Some(out),
                            Some(want) => assert!(
                                out.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "case {c} {dtype} {isa:?} t{threads} {products:?}: BF16 outputs differ"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn overlapping_sequences_are_refused() {
    let pool = ThreadPool::new(1);
    let shape = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    let x = CpuActivations::zeros(3, 4);
    let mut out = CpuActivations::zeros(3, 4);
    let mut store = CpuKvStore::default();
    let layout =
        KvLayout::new(KvFormat::of(KvType::F32), 1, 1, 4, 4, &[]).expect("a layout of whole heads");
    let (mut a, mut b) = (BlockTable::new(layout.clone()), BlockTable::new(layout));
    grow(&mut store, &mut a, 4).expect("an unlimited store grows");
    grow(&mut store, &mut b, 4).expect("an unlimited store grows");
    let seqs = [
        SeqRows {
            table: &a,
            rows: 0..2,
            start_pos: 0,
            prompt: false,
        },
        SeqRows {
            table: &b,
            rows: 1..3,
            start_pos: 0,
            prompt: false,
        },
    ];
    let call = layer0(shape, &x, &x, &x, Products::F32);
    let isa = CheckedIsa::at_most(Isa::Scalar);
    assert!(attention(&pool, isa, call, &mut store, &seqs, &mut out).is_err());
}

#[test]
fn a_block_written_by_one_sequence_and_read_by_another_is_refused() {
    let pool = ThreadPool::new(1);
    let shape = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    let x = CpuActivations::zeros(2, 4);
    let mut out = CpuActivations::zeros(2, 4);
    let mut store = CpuKvStore::default();
    let layout =
        KvLayout::new(KvFormat::of(KvType::F32), 1, 1, 4, 4, &[]).expect("a layout of whole heads");
    let mut a = BlockTable::new(layout);
    grow(&mut store, &mut a, 4).expect("an unlimited store grows");
    // Two tables naming one block: what a shared prompt block is.
    let b = a.clone();
    let seq = |table, row: usize, start_pos| SeqRows {
        table,
        rows: row..row + 1,
        start_pos,
        prompt: false,
    };
    let call = layer0(shape, &x, &x, &x, Products::F32);
    let isa = CheckedIsa::at_most(Isa::Scalar);
    let both = [seq(&a, 0, 0), seq(&b, 1, 1)];
    let err = attention(&pool, isa, call, &mut store, &both, &mut out).unwrap_err();
    assert!(err.to_string().contains("written by one sequence"), "{err}");
    // Alone, each may write it (the engine decides who holds it).
    assert!(attention(&pool, isa, call, &mut store, &both[..1], &mut out).is_ok());
    // A table naming a block the store does not hold is refused.
    let mut stale = BlockTable::new(
        KvLayout::new(KvFormat::of(KvType::F32), 1, 1, 4, 4, &[]).expect("a layout of whole heads"),
    );
    stale
        .push(0, crate::kv::BlockId(99))
        .expect("a table takes any block id");
    let err = attention(&pool, isa, call, &mut store, &[seq(&stale, 0, 0)], &mut out).unwrap_err();
    assert!(err.to_string().contains("no block"), "{err}");
}

/// A prompt's rows take their BF16 products on AMX tiles where the host
/// has them (`blocked_amx`: 32-row tiles, the sums rounded the
/// instruction's way, blocks folded in spans of up to 256 positions,
/// `blocked_span`): within the BF16 tolerance of the
/// reference, and within twice the probabilities' rounding (2 · 2⁻⁹) of
/// the same call on `vdpbf16ps`, on outputs in ±1: a span rounds each
/// probability relative to the span's running maximum, `vdpbf16ps`'s path
/// relative to each block's (each within 2⁻⁹ of the exact weights); at
/// one and three threads.
#[test]
fn bf16_prompt_chunks_on_amx_match_the_reference() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let b = bf16::Bf16Isa::new(isa);
    if !b.amx() {
        println!("no AMX here: the BF16 kernels run on vdpbf16ps or their scalar twins");
    }
    let cases = [
        // Gemma 3's heads: a chunk of 130 rows from the start, one of 128
        // after 200 positions (the reference reads every key per row and
        // head: deeper contexts cost minutes here).
        Case {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            seqs: vec![(0, 130), (200, 128)],
        },
        // A group of three (24 queries a tile of eight rows: a partial
        // AMX tile) and 64 dimensions.
        Case {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 64,
            seqs: vec![(70, 140)],
        },
    ];
    for (c, case) in cases.iter().enumerate() {
        for threads in [1, 3] {
            let mut outs = Vec::new();
            for products in [b, b.without_amx()] {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(120 + c as u64);
                outs.push(check(
                    isa,
                    threads,
                    KvType::F16,
                    Some(products),
                    case,
                    &mut rng,
                ));
            }
            for (a, w) in outs[0].iter().zip(&outs[1]) {
                assert!(
                    (a - w).abs() <= 2.0 * 2f32.powi(-9),
                    "case {c} t{threads}: AMX {a} against {w}"
                );
            }
        }
    }
}

/// A prompt's tiles fold the blocks all their rows see whole through the
/// blocked kernels (`blocked`), a decode step row by row through the
/// per-row ones, and a decode step with f32 products through the `decode`
/// kernel: each row's output is the same bits either way, with f32 and
/// BF16 products (`vdpbf16ps`, and AMX's tiles for prompt rows of one row
/// each), F16 and F32 caches, with and without a window and a softcap.
#[test]
fn a_prompt_gives_each_row_the_bits_of_its_decode_step() {
    let isa = CheckedIsa::at_most(Isa::supported().into_iter().max().unwrap_or(Isa::Scalar));
    let pool = ThreadPool::new(2);
    let cases = [
        // Gemma 3's heads; a group of three and an odd head; a window.
        (4, 1, 256, None, None),
        (6, 2, 33, None, None),
        (4, 1, 40, Some(100), Some(30.0f32)),
        // SmolLM2's heads; a group past `GROUP_MAX` with a window.
        (9, 3, 64, None, None),
        (6, 1, 64, Some(70), None),
    ];
    let (before, rows) = (150usize, 37usize);
    let total = before + rows;
    for (c, &(n_heads, n_kv_heads, head_dim, window, softcap)) in cases.iter().enumerate() {
        let b = bf16::Bf16Isa::new(isa);
        let kinds = [
            Products::F32,
            Products::Bf16(b),
            Products::Bf16(b.without_amx()),
        ];
        for (products, kv_type) in kinds
            .into_iter()
            .flat_map(|p| [(p, KvType::F16), (p, KvType::F32)])
        {
            let shape = AttentionShape {
                n_heads,
                n_kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
                softcap,
            };
            let (q_cols, kv_cols) = (n_heads * head_dim, n_kv_heads * head_dim);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(90 + c as u64);
            let q_all = random(&mut rng, total * q_cols, 3.0);
            let k_all = random(&mut rng, total * kv_cols, 3.0);
            let v_all = random(&mut rng, total * kv_cols, 1.0);
            // The same positions as one prompt chunk, then as decode steps.
            let steps: Vec<usize> = std::iter::once(before)
                .chain(std::iter::repeat_n(1, rows))
                .collect();
            let mut outs = Vec::new();
            for chunks in [vec![before, rows], steps] {
                let kv = KvFormat::new(kv_type, 64);
                let mut cache = crate::cpu::kv_cache::CpuKvCache::windowed(
                    &kv,
                    1,
                    n_kv_heads,
                    head_dim,
                    total,
                    &[window],
                )
                .expect("an unlimited pool holds the cache");
                let mut all = Vec::new();
                let mut start = 0;
                for n in chunks {
                    let act = |data: &[f32], cols: usize| {
                        act_from(n, cols, data[start * cols..(start + n) * cols].to_vec())
                    };
                    let (q, k, v) = (
                        act(&q_all, q_cols),
                        act(&k_all, kv_cols),
                        act(&v_all, kv_cols),
                    );
                    let mut out = CpuActivations::zeros(n, q_cols);
                    let (store, seq) = cache.rows(0..n, start, true).expect("the cache's blocks");
                    let call = layer0(shape, &q, &k, &v, products);
                    attention(&pool, isa, call, store, &[seq], &mut out)
                        .expect("attention over an allocated cache");
                    all.extend(out.data);
                    start += n;
                }
                outs.push(all[before * q_cols..].to_vec());
            }
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&outs[0]) == bits(&outs[1]),
                "case {c} {products:?} {kv_type:?}: a prompt's rows differ from their decode steps"
            );
        }
    }
}
