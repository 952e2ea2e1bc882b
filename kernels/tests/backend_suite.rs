//! What every backend must do, written once against [`Backend`] and run on
//! each compiled one by `test_device!`: matmuls against the GGUF formats'
//! scalar dequantization (the oracle every device is held to), and KV
//! blocks handed from one cache to another attending exactly as the cache
//! that wrote them. Inputs enter and results leave only through the
//! trait (an F32 matrix embedded row by row; `host_rows`).

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;
#[macro_use]
mod devices;

use bytes::Bytes;
use common::{contract_quantize, random_weights, rng};
use rand::Rng;
use switchyard_kernels::formats::dequantize_row;
use switchyard_kernels::kv::KV_UNIT;
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, BlockTable, DType, KvFormat, KvLayout, KvType,
    WeightView,
};

/// Quantized weights against the f64 oracle, relative to `Σ|w_i x̂_i|`:
/// the integer block sums are exact and only f32 arithmetic rounds (see
/// `matmul.rs` for the bound); a wrong block, nibble or scale is off by
/// ≥ 1e-3.
const QUANT_REL_TOL: f64 = 1e-5;
/// Float weights: an f32 sum of ≤ 576 products, about √k·2⁻²⁴ ≈ 1.5e-6.
const FLOAT_REL_TOL: f64 = 2e-5;
const ABS_TOL: f64 = 1e-6;

/// `values` (`rows × cols`) as the backend's activations: the rows of an
/// F32 matrix, embedded.
fn upload<B: Backend>(backend: &B, rows: usize, cols: usize, values: &[f32]) -> B::Activations {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let table = WeightView::new(DType::F32, rows, cols, Bytes::from(bytes)).unwrap();
    let table = backend.matrix(table).unwrap();
    let mut out = backend.activations(rows, cols);
    let tokens: Vec<u32> = (0..rows as u32).collect();
    backend.embed(&table, &tokens, &mut out).unwrap();
    out
}

fn download<B: Backend>(backend: &B, x: &B::Activations) -> Vec<f32> {
    let mut staging = Vec::new();
    backend.host_rows(x, &mut staging).to_vec()
}

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn matmul_matches_the_formats_oracle<B: Backend>(backend: &B) {
    let mut rng = rng(33);
    let (n, rows) = (3, 8);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
        DType::IQ4NL,
    ] {
        let k = if dtype.block_len() == 256 { 512 } else { 576 };
        let w = random_weights(&mut rng, dtype, rows, k);
        let x = random(&mut rng, n * k);
        let matrix = WeightView::new(dtype, rows, k, Bytes::from(w.clone())).unwrap();
        let matrix = backend.matrix(matrix).unwrap();
        let mut y = backend.activations(n, rows);
        backend
            .matmul(&upload(backend, n, k, &x), &matrix, None, &mut y)
            .unwrap();
        let got = download(backend, &y);
        let row_bytes = dtype.bytes_for(k).unwrap();
        let tol = if dtype.is_quantized() {
            QUANT_REL_TOL
        } else {
            FLOAT_REL_TOL
        };
        let mut w_row = vec![0.0f32; k];
        for r in 0..rows {
            dequantize_row(dtype, &w[r * row_bytes..(r + 1) * row_bytes], &mut w_row).unwrap();
            for t in 0..n {
                let xs = &x[t * k..(t + 1) * k];
                let xs: Vec<f64> = if dtype.is_quantized() {
                    contract_quantize(xs)
                } else {
                    xs.iter().map(|v| f64::from(*v)).collect()
                };
                let (want, magnitude) = w_row.iter().zip(&xs).fold((0.0, 0.0), |(s, m), (w, x)| {
                    (s + f64::from(*w) * x, m + (f64::from(*w) * x).abs())
                });
                let g = f64::from(got[t * rows + r]);
                assert!(
                    (g - want).abs() <= tol * magnitude + ABS_TOL,
                    "{dtype} row {r} token {t}: {g} vs {want}"
                );
            }
        }
    }
}
test_device!(matmul_matches_the_formats_oracle);

/// One decode row's attention at `pos` over `table`, with its `k`, `v`.
fn attend<B: Backend>(
    backend: &B,
    store: &mut B::KvStore,
    table: &BlockTable,
    shape: AttentionShape,
    (q, k, v): (&B::Activations, &B::Activations, &B::Activations),
    rows: std::ops::Range<usize>,
    pos: usize,
) -> Vec<f32> {
    let mut out = backend.activations(rows.end, shape.n_heads * shape.head_dim);
    let seqs = [AttentionRows {
        table,
        rows,
        start_pos: pos,
        prompt: true,
    }];
    for layer in 0..2 {
        backend
            .attention(layer, shape, q, k, v, store, &seqs, &mut out)
            .unwrap();
    }
    download(backend, &out)
}

/// Allocates `table`'s blocks of every layer up to `blocks` each.
fn grow<B: Backend>(backend: &B, store: &mut B::KvStore, table: &mut BlockTable, blocks: usize) {
    let shape = table.layout().block_shape(table.layout().block_positions());
    for layer in 0..table.layout().layers() {
        while table.layer(layer).len() < blocks {
            let id = backend.kv_alloc(store, shape).unwrap();
            table.push(layer, id).unwrap();
        }
    }
}

fn shared_and_copied_blocks_attend_as_the_table_that_wrote_them<B: Backend>(backend: &B) {
    let mut rng = rng(34);
    let shape = AttentionShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    let block = 2 * KV_UNIT;
    // Two layers; a block and a half written: block 0 shared in place, the
    // written unit of block 1 copied into a tail and from there into the
    // second table's own block.
    let prompt = block + KV_UNIT;
    for dtype in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let format = KvFormat::new(dtype, block);
        let layout = KvLayout::new(format, 2, 2, 64, 4 * block, &[]).unwrap();
        let mut store = backend.kv_store(format, usize::MAX).unwrap();
        let mut first = BlockTable::new(layout.clone());
        grow(backend, &mut store, &mut first, 3);
        let (qw, kw) = (4 * 64, 2 * 64);
        let q = upload(backend, prompt, qw, &random(&mut rng, prompt * qw));
        let k = upload(backend, prompt, kw, &random(&mut rng, prompt * kw));
        let v = upload(backend, prompt, kw, &random(&mut rng, prompt * kw));
        attend(
            backend,
            &mut store,
            &first,
            shape,
            (&q, &k, &v),
            0..prompt,
            0,
        );
        let mut second = BlockTable::new(layout.clone());
        for layer in 0..2 {
            let tail = backend
                .kv_alloc(&mut store, layout.block_shape(KV_UNIT))
                .unwrap();
            backend
                .kv_copy(&mut store, first.layer(layer)[1], tail, KV_UNIT)
                .unwrap();
            let own = backend
                .kv_alloc(&mut store, layout.block_shape(block))
                .unwrap();
            backend.kv_copy(&mut store, tail, own, KV_UNIT).unwrap();
            B::kv_free(&mut store, tail);
            second.push(layer, first.layer(layer)[0]).unwrap();
            second.push(layer, own).unwrap();
        }
        grow(backend, &mut store, &mut second, 3);
        // The next position, the same row in both.
        let q = upload(backend, 1, qw, &random(&mut rng, qw));
        let k = upload(backend, 1, kw, &random(&mut rng, kw));
        let v = upload(backend, 1, kw, &random(&mut rng, kw));
        let step = (&q, &k, &v);
        let want = attend(backend, &mut store, &first, shape, step, 0..1, prompt);
        let got = attend(backend, &mut store, &second, shape, step, 0..1, prompt);
        assert_eq!(
            got, want,
            "{dtype}: the table of shared blocks attends apart"
        );
        // A block one sequence writes cannot be read by another of the call.
        let q2 = upload(backend, 2, qw, &random(&mut rng, 2 * qw));
        let kv2 = upload(backend, 2, kw, &random(&mut rng, 2 * kw));
        let seqs = [
            AttentionRows {
                table: &first,
                rows: 0..1,
                start_pos: 3,
                prompt: false,
            },
            AttentionRows {
                table: &second,
                rows: 1..2,
                start_pos: prompt + 1,
                prompt: false,
            },
        ];
        let mut out = backend.activations(2, qw);
        assert!(
            backend
                .attention(0, shape, &q2, &kv2, &kv2, &mut store, &seqs, &mut out)
                .is_err(),
            "{dtype}: a write into a block another sequence reads"
        );
        // A copy between blocks of different shapes is refused.
        let other = backend
            .kv_alloc(
                &mut store,
                KvLayout::new(format, 2, 1, 64, 4 * block, &[])
                    .unwrap()
                    .block_shape(block),
            )
            .unwrap();
        assert!(backend
            .kv_copy(&mut store, first.layer(0)[0], other, KV_UNIT)
            .is_err());
    }
}
test_device!(shared_and_copied_blocks_attend_as_the_table_that_wrote_them);
