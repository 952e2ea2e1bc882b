//! rms_norm, rope, attention (softmax included), silu_mul, add and embed on
//! every ISA, against naive f64 code.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use common::{isas_to_test, random_weights, rng};
use rand::Rng;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, CpuKvStore};
use switchyard_kernels::formats::dequantize_row;
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, BlockTable, DType, KernelError, KvFormat, KvLayout,
    KvType, RopeStyle, WeightView,
};

/// rms_norm: a 576-wide f32 sum of squares (error ≲ √576·2⁻²⁴ relative),
/// a sqrt and two multiplies: a few 1e-7 relative; 1e-5 leaves margin.
const NORM_REL_TOL: f64 = 1e-5;
/// rope: cos/sin rounded to f32 (½ ulp each) and an f32 rotate (a multiply
/// and an add): about 2 ulp of the pair's magnitude; allow 4.
const ROPE_ULPS: f64 = 4.0;
/// attention outputs are convex combinations of values in ±1. Scores come
/// from 64-long f32 dots (≲ 1e-6), then `exp` (≈ 1 ulp) and sums over at
/// most a few dozen positions; 2e-5 absolute leaves margin.
const ATTENTION_ABS_TOL: f64 = 2e-5;
/// silu·up: one f32 exp, a divide and a multiply: a few ulp.
const SILU_REL_TOL: f64 = 1e-6;

fn random_vec(rng: &mut impl Rng, n: usize, range: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-range..range)).collect()
}

#[test]
fn rms_norm_matches_f64() {
    let mut rng = rng(1);
    for isa in isas_to_test("rms_norm") {
        for threads in 1..=3 {
            let backend = CpuBackend::with_isa(threads, isa);
            for (rows, cols) in [(1, 576), (3, 576), (17, 100), (2, 7)] {
                let x = random_vec(&mut rng, rows * cols, 3.0);
                let w = random_vec(&mut rng, cols, 2.0);
                let eps = 1e-5f32;
                let xa = CpuActivations::from_values(rows, cols, &x).unwrap();
                let mut out = backend.activations(rows, cols);
                backend
                    .rms_norm(&xa, &backend.vector(&w).unwrap(), eps, &mut out)
                    .unwrap();
                for r in 0..rows {
                    let row = &x[r * cols..(r + 1) * cols];
                    let ms = row.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / cols as f64;
                    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
                    for c in 0..cols {
                        let want = f64::from(w[c]) * f64::from(row[c]) * inv;
                        let got = f64::from(out.as_slice()[r * cols + c]);
                        assert!(
                            (got - want).abs() <= NORM_REL_TOL * want.abs() + 1e-7,
                            "{isa} {rows}x{cols}"
                        );
                    }
                }
            }
        }
    }
}

fn rope_reference(
    x: &[f32],
    head_dim: usize,
    pos: u32,
    inv_freq: &[f32],
    style: RopeStyle,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
    for head in out.chunks_exact_mut(head_dim) {
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = f64::from(pos) * f64::from(*f);
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + head_dim / 2),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * angle.cos() - x1 * angle.sin();
            head[b] = x0 * angle.sin() + x1 * angle.cos();
        }
    }
    out
}

#[test]
fn rope_matches_f64_in_both_styles() {
    let mut rng = rng(2);
    let head_dim = 64;
    let inv_freq: Vec<f32> = (0..head_dim / 2)
        .map(|i| 100_000f32.powf(-2.0 * i as f32 / head_dim as f32))
        .collect();
    let positions = [0u32, 1, 7, 2047, 100_000];
    for threads in 1..=3 {
        let backend = CpuBackend::new(threads);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let cols = 3 * head_dim;
            let x = random_vec(&mut rng, positions.len() * cols, 2.0);
            let mut xa = CpuActivations::from_values(positions.len(), cols, &x).unwrap();
            backend
                .rope(&mut xa, head_dim, &positions, &inv_freq, style)
                .unwrap();
            for (r, pos) in positions.iter().enumerate() {
                let want = rope_reference(
                    &x[r * cols..(r + 1) * cols],
                    head_dim,
                    *pos,
                    &inv_freq,
                    style,
                );
                let got = &xa.as_slice()[r * cols..(r + 1) * cols];
                let scale = x[r * cols..(r + 1) * cols]
                    .iter()
                    .fold(0.0f32, |m, v| m.max(v.abs()));
                for (g, w) in got.iter().zip(&want) {
                    let bound = ROPE_ULPS * f64::from(f32::EPSILON) * 2.0 * f64::from(scale);
                    assert!(
                        (f64::from(*g) - w).abs() <= bound,
                        "{style:?} pos {pos}: {g} vs {w}"
                    );
                }
            }
        }
    }
    let backend = CpuBackend::new(1);
    let mut xa = backend.activations(1, 64);
    assert!(backend
        .rope(&mut xa, 64, &[0, 1], &inv_freq, RopeStyle::Neox)
        .is_err());
    assert!(backend
        .rope(&mut xa, 63, &[0], &inv_freq, RopeStyle::Neox)
        .is_err());
}

/// Naive causal GQA attention in f64 over the full history `keys/values`
/// (`positions × kv_cols`), for a query row at `pos`.
fn attention_reference(
    shape: AttentionShape,
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    pos: usize,
) -> Vec<f64> {
    let hd = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    let mut out = vec![0.0f64; shape.n_heads * hd];
    for h in 0..shape.n_heads {
        let g = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f64> = (0..=pos)
            .map(|t| {
                let k = &keys[t][g * hd..(g + 1) * hd];
                f64::from(shape.scale)
                    * qh.iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        for (t, e) in exps.iter().enumerate() {
            for d in 0..hd {
                out[h * hd + d] += e / total * f64::from(values[t][g * hd + d]);
            }
        }
    }
    out
}

#[derive(Clone, Default)]
struct History {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// `x` in groups of 32 as a Q8_0 cache stores it (the contract of
/// `kv_q8`, written out again): `d = amax / 127`, `q = round_ties_even(x /
/// d)` (times `1/d`), read back as `q · f16(d)`.
fn q8_0_rounded(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|g| {
            let d = g.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let s = half::f16::from_f32(d).to_f32();
            g.iter()
                .map(move |v| f32::from((v * id).round_ties_even() as i8) * s)
        })
        .collect()
}

#[test]
fn attention_matches_f64_over_prefill_and_decode() {
    let shape = AttentionShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 1.0 / 8.0,
        window: None,
        softcap: None,
    };
    let q_cols = shape.n_heads * shape.head_dim;
    let kv_cols = shape.n_kv_heads * shape.head_dim;
    let mut rng = rng(3);
    // F16 and Q8_0 caches are checked against the reference on the keys
    // and values rounded as they store them, at the same tolerance.
    let kv_types = [KvType::F32, KvType::F16, KvType::Q8_0];
    for (isa, kv_type) in isas_to_test("attention")
        .into_iter()
        .flat_map(|isa| kv_types.map(|t| (isa, t)))
    {
        let stored = |x: &[f32]| -> Vec<f32> {
            match kv_type {
                KvType::F32 => x.to_vec(),
                KvType::F16 => x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
                KvType::Q8_0 => q8_0_rounded(x),
            }
        };
        for threads in 1..=3 {
            let backend = CpuBackend::with_isa(threads, isa);
            let layers = 2;
            let format = KvFormat::new(kv_type, 32);
            let layout =
                KvLayout::new(format, layers, shape.n_kv_heads, shape.head_dim, 32, &[]).unwrap();
            let mut cache = Seq::new(&backend, layout);
            // Per layer, every key and value row written so far.
            let mut history = vec![History::default(); layers];
            // Steps as (rows in the batch, the sequence's rows, start position):
            // a prefill of 5, decodes, then a 2-row chunk placed in the middle
            // of a 4-row batch, then a decode with a large query (softmax
            // must subtract the max to stay finite).
            let steps = [
                (5, 0..5, 0),
                (1, 0..1, 5),
                (1, 0..1, 6),
                (4, 1..3, 7),
                (1, 0..1, 9),
            ];
            for (step, (batch, rows, start)) in steps.into_iter().enumerate() {
                let q_scale = if step == 4 { 400.0 } else { 1.0 };
                let q = random_vec(&mut rng, batch * q_cols, q_scale);
                let k = random_vec(&mut rng, batch * kv_cols, 1.0);
                let v = random_vec(&mut rng, batch * kv_cols, 1.0);
                let (qa, ka, va) = (
                    CpuActivations::from_values(batch, q_cols, &q).unwrap(),
                    CpuActivations::from_values(batch, kv_cols, &k).unwrap(),
                    CpuActivations::from_values(batch, kv_cols, &v).unwrap(),
                );
                for (layer, History { keys, values }) in history.iter_mut().enumerate() {
                    let mut out = backend.activations(batch, q_cols);
                    attend_one(
                        &backend,
                        &mut cache,
                        layer,
                        shape,
                        &qa,
                        &ka,
                        &va,
                        rows.clone(),
                        start,
                        &mut out,
                    )
                    .unwrap();
                    for row in rows.clone() {
                        keys.push(stored(&k[row * kv_cols..(row + 1) * kv_cols]));
                        values.push(stored(&v[row * kv_cols..(row + 1) * kv_cols]));
                    }
                    for (i, row) in rows.clone().enumerate() {
                        let want = attention_reference(
                            shape,
                            &q[row * q_cols..(row + 1) * q_cols],
                            keys,
                            values,
                            start + i,
                        );
                        let got = &out.as_slice()[row * q_cols..(row + 1) * q_cols];
                        for (g, w) in got.iter().zip(&want) {
                            assert!(g.is_finite(), "{isa} step {step}: non-finite output");
                            assert!(
                                (f64::from(*g) - w).abs() <= ATTENTION_ABS_TOL,
                                "{isa} {kv_type} t{threads} step {step} layer {layer}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn attention_reports_a_full_cache_and_bad_shapes() {
    let backend = CpuBackend::new(1);
    let shape = AttentionShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    let layout = KvLayout::new(KvFormat::of(KvType::F32), 1, 1, 4, 4, &[]).unwrap();
    let mut cache = Seq::new(&backend, layout.clone());
    let q = backend.activations(2, 8);
    let kv = backend.activations(2, 4);
    let mut out = backend.activations(2, 8);
    attend_one(
        &backend,
        &mut cache,
        0,
        shape,
        &q,
        &kv,
        &kv,
        0..2,
        0,
        &mut out,
    )
    .unwrap();
    attend_one(
        &backend,
        &mut cache,
        0,
        shape,
        &q,
        &kv,
        &kv,
        0..1,
        2,
        &mut out,
    )
    .unwrap();
    let full = attend_one(
        &backend,
        &mut cache,
        0,
        shape,
        &q,
        &kv,
        &kv,
        0..2,
        3,
        &mut out,
    );
    assert!(
        matches!(full, Err(KernelError::KvCacheFull { capacity: 4, .. })),
        "{full:?}"
    );
    // A table without the blocks, a layer past the end, mismatched heads.
    assert!(attend_one(
        &backend,
        &mut cache,
        0,
        shape,
        &q,
        &kv,
        &kv,
        0..1,
        3,
        &mut out
    )
    .is_ok());
    let mut fresh = Seq::new(&backend, layout);
    let unallocated = [AttentionRows {
        table: &fresh.table,
        rows: 0..1,
        start_pos: 2,
        prompt: false,
    }];
    assert!(backend
        .attention(
            0,
            shape,
            &q,
            &kv,
            &kv,
            &mut fresh.store,
            &unallocated,
            &mut out
        )
        .is_err());
    assert!(attend_one(
        &backend,
        &mut fresh,
        1,
        shape,
        &q,
        &kv,
        &kv,
        0..1,
        0,
        &mut out
    )
    .is_err());
    let bad = AttentionShape {
        n_kv_heads: 3,
        ..shape
    };
    assert!(attend_one(
        &backend,
        &mut fresh,
        0,
        bad,
        &q,
        &kv,
        &kv,
        0..1,
        0,
        &mut out
    )
    .is_err());
}

#[test]
fn silu_mul_and_add_match_f64() {
    let mut rng = rng(4);
    for threads in 1..=3 {
        let backend = CpuBackend::new(threads);
        // 3 × 20000 spans several parallel tasks.
        for (rows, cols) in [(1, 1536), (3, 20000)] {
            let g = random_vec(&mut rng, rows * cols, 8.0);
            let u = random_vec(&mut rng, rows * cols, 2.0);
            let mut ga = CpuActivations::from_values(rows, cols, &g).unwrap();
            let ua = CpuActivations::from_values(rows, cols, &u).unwrap();
            backend.silu_mul(&mut ga, &ua).unwrap();
            for ((got, g), u) in ga.as_slice().iter().zip(&g).zip(&u) {
                let g = f64::from(*g);
                let want = g / (1.0 + (-g).exp()) * f64::from(*u);
                assert!((f64::from(*got) - want).abs() <= SILU_REL_TOL * want.abs() + 1e-12);
            }
            let mut xa = CpuActivations::from_values(rows, cols, &g).unwrap();
            backend.add(&mut xa, &ua).unwrap();
            for ((got, g), u) in xa.as_slice().iter().zip(&g).zip(&u) {
                assert_eq!(*got, g + u);
            }
            let wrong: CpuActivations = backend.activations(rows, cols + 1);
            assert!(backend.add(&mut xa, &wrong).is_err());
            assert!(backend.silu_mul(&mut xa, &wrong).is_err());
        }
    }
}

#[test]
fn embed_dequantizes_rows_and_rejects_unknown_tokens() {
    let mut rng = rng(5);
    let backend = CpuBackend::new(2);
    for dtype in DType::ALL {
        let (rows, cols) = (10, 256);
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let table = backend
            .matrix(WeightView::new(dtype, rows, cols, Bytes::from(bytes.clone())).unwrap())
            .unwrap();
        let tokens = [3u32, 0, 9, 3];
        let mut out = backend.activations(tokens.len(), cols);
        backend.embed(&table, &tokens, &mut out).unwrap();
        for (i, t) in tokens.iter().enumerate() {
            let t = *t as usize;
            let mut want = vec![0.0f32; cols];
            dequantize_row(dtype, &bytes[t * row_bytes..(t + 1) * row_bytes], &mut want).unwrap();
            assert_eq!(
                &out.as_slice()[i * cols..(i + 1) * cols],
                &want[..],
                "{dtype}"
            );
        }
        let mut one = backend.activations(1, cols);
        assert!(backend.embed(&table, &[10], &mut one).is_err());
    }
}

#[test]
fn row_resize_and_name() {
    let backend = CpuBackend::new(1);
    assert!(backend.name().starts_with("cpu-"));
    let mut x = CpuActivations::from_values(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let mut out = [0.0f32; 3];
    out.copy_from_slice(x.row(1).unwrap());
    assert_eq!(out, [4.0, 5.0, 6.0]);
    backend.resize(&mut x, 4, 5);
    assert_eq!((x.rows(), x.cols(), x.as_slice().len()), (4, 5, 20));
}

/// One sequence's attention through the backend's batched call.
/// A sequence's table and a store of its own.
struct Seq {
    store: CpuKvStore,
    table: BlockTable,
}

impl Seq {
    fn new(backend: &CpuBackend, layout: KvLayout) -> Seq {
        Seq {
            store: backend
                .kv_store(KvFormat::of(layout.dtype()), usize::MAX)
                .unwrap(),
            table: BlockTable::new(layout),
        }
    }
}

/// Attention of one sequence, its blocks for the rows allocated first.
#[allow(clippy::too_many_arguments)]
fn attend_one(
    backend: &CpuBackend,
    cache: &mut Seq,
    layer: usize,
    shape: AttentionShape,
    q: &CpuActivations,
    k: &CpuActivations,
    v: &CpuActivations,
    rows: std::ops::Range<usize>,
    start_pos: usize,
    out: &mut CpuActivations,
) -> Result<(), KernelError> {
    let end = start_pos + rows.len();
    let block = cache
        .table
        .layout()
        .block_shape(cache.table.layout().block_positions());
    for l in 0..cache.table.layout().layers() {
        while cache.table.layer(l).len() < cache.table.blocks_for(l, end) {
            let id = backend.kv_alloc(&mut cache.store, block)?;
            cache.table.push(l, id)?;
        }
    }
    let seqs = [AttentionRows {
        table: &cache.table,
        rows,
        start_pos,
        prompt: true,
    }];
    backend.attention(layer, shape, q, k, v, &mut cache.store, &seqs, out)
}
