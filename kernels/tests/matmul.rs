//! Matmul on every ISA and weight type against a naive f64 reference that
//! follows the activation-quantization contract, and SIMD against scalar.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use common::{contract_quantize, isas_to_test, random_activations, random_weights, rng};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, Isa};
use switchyard_kernels::formats::dequantize_row;
use switchyard_kernels::{Backend, DType, MatmulInput, MatmulProduct, WeightView};

/// Quantized types against the f64 reference, relative to `Σ|w_i x̂_i|`.
/// The integer block sums are exact, so the only error is f32 arithmetic:
/// one rounding for each `d_w·d_a` (and `m·s`) product and one per f32
/// addition of up to `2·k/32` block terms (≤ 144 at k = 2304). Each is at
/// most 2⁻²⁴ ≈ 6e-8 of a partial sum no larger than the magnitude times the
/// cancellation between a Q4_1/Q4_K block's scale and min terms (≤ ~4×), so
/// 1e-5 bounds the random-walk error with a wide margin yet still catches
/// any wrong block, nibble or scale (those are off by ≥ 1e-3).
const QUANT_REL_TOL: f64 = 1e-5;

/// Float weight types (activations not quantized): a sequential or lane-wise
/// f32 sum of `k ≤ 2304` products; the worst case is k·2⁻²⁴ ≈ 1.4e-4 but
/// the actual random-walk error is about √k·2⁻²⁴ ≈ 3e-6; 2e-5 leaves margin.
const FLOAT_REL_TOL: f64 = 2e-5;

/// Absolute slack for outputs whose magnitude is near zero (a row of zero
/// activations): f32 noise of exact zeros is zero, so this only matters for
/// tiny denormal-level leftovers.
const ABS_TOL: f64 = 1e-6;

fn k_sizes(dtype: DType) -> &'static [usize] {
    if dtype.block_len() == 256 {
        &[256, 1536, 2304]
    } else {
        &[32, 256, 576, 1536, 2304]
    }
}

/// `(y, magnitude)`, both `n × rows`, in f64.
fn reference(
    dtype: DType,
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let row_bytes = dtype.bytes_for(k).unwrap();
    let xs: Vec<Vec<f64>> = (0..n)
        .map(|t| {
            let row = &x[t * k..(t + 1) * k];
            if dtype.is_quantized() {
                contract_quantize(row)
            } else {
                row.iter().map(|v| f64::from(*v)).collect()
            }
        })
        .collect();
    let mut y = vec![0.0; n * rows];
    let mut magnitude = vec![0.0; n * rows];
    let mut w_row = vec![0.0f32; k];
    for r in 0..rows {
        dequantize_row(dtype, &w[r * row_bytes..(r + 1) * row_bytes], &mut w_row).unwrap();
        for (t, xs) in xs.iter().enumerate() {
            let (mut sum, mut mag) = (0.0f64, 0.0f64);
            for (w, x) in w_row.iter().zip(xs) {
                sum += f64::from(*w) * x;
                mag += (f64::from(*w) * x).abs();
            }
            y[t * rows + r] = sum;
            magnitude[t * rows + r] = mag;
        }
    }
    (y, magnitude)
}

fn run(
    backend: &CpuBackend,
    dtype: DType,
    w: &Bytes,
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let matrix = backend
        .matrix(WeightView::new(dtype, rows, k, w.clone()).unwrap())
        .unwrap();
    let x = CpuActivations::from_values(n, k, x).unwrap();
    let mut y = backend.activations(n, rows);
    backend.matmul(&x, &matrix, None, &mut y).unwrap();
    y.as_slice().to_vec()
}

#[test]
fn matmul_matches_f64_reference_and_scalar_on_every_isa() {
    let isas = isas_to_test("matmul");
    // Thread counts vary with the ISA so 1, 2 and 3 threads all run.
    let backends: Vec<CpuBackend> = isas
        .iter()
        .enumerate()
        .map(|(i, isa)| CpuBackend::with_isa(1 + i % 3, *isa))
        .collect();
    let scalar_3 = CpuBackend::with_isa(3, Isa::Scalar);
    let mut rng = rng(11);
    let mut checked = 0;
    for dtype in DType::ALL {
        let tol = if dtype.is_quantized() {
            QUANT_REL_TOL
        } else {
            FLOAT_REL_TOL
        };
        for &k in k_sizes(dtype) {
            // 16, 33 and 49 rows cover the 16-row groups of repacked matrices
            // (AVX-512 VNNI) with and without tail rows.
            for rows in [1usize, 3, 7, 16, 33, 49] {
                let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
                for n in 1..=9 {
                    let x = random_activations(&mut rng, n, k);
                    let (want, magnitude) = reference(dtype, &w, rows, k, &x, n);
                    let scalar = run(&backends[0], dtype, &w, rows, k, &x, n);
                    assert_eq!(
                        scalar,
                        run(&scalar_3, dtype, &w, rows, k, &x, n),
                        "{dtype} k={k} rows={rows} n={n}: thread count changed the result"
                    );
                    for (backend, isa) in backends.iter().zip(&isas) {
                        let got = run(backend, dtype, &w, rows, k, &x, n);
                        for i in 0..n * rows {
                            let bound = tol * magnitude[i] + ABS_TOL;
                            let err = (f64::from(got[i]) - want[i]).abs();
                            assert!(
                                err <= bound,
                                "{isa} {dtype} k={k} rows={rows} n={n} out[{i}]: got {} want {} (err {err:e} > {bound:e})",
                                got[i],
                                want[i]
                            );
                            let diff = (f64::from(got[i]) - f64::from(scalar[i])).abs();
                            assert!(
                                diff <= 2.0 * bound,
                                "{isa} vs scalar {dtype} k={k} rows={rows} n={n} out[{i}]: {} vs {}",
                                got[i],
                                scalar[i]
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    println!("matmul: {checked} (isa, dtype, shape) cases checked");
}

#[test]
fn bias_is_added_per_output_row() {
    let mut rng = rng(5);
    for isa in isas_to_test("matmul bias") {
        let backend = CpuBackend::with_isa(2, isa);
        for dtype in [DType::Q4_1, DType::F16] {
            let (rows, k, n) = (5, 64, 3);
            let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
            let x = random_activations(&mut rng, n, k);
            let plain = run(&backend, dtype, &w, rows, k, &x, n);
            let bias_values = [1.0f32, -2.0, 3.5, 0.0, 10.0];
            let bias = backend.vector(&bias_values).unwrap();
            let matrix = backend
                .matrix(WeightView::new(dtype, rows, k, w.clone()).unwrap())
                .unwrap();
            let xa = CpuActivations::from_values(n, k, &x).unwrap();
            let mut y = backend.activations(n, rows);
            backend.matmul(&xa, &matrix, Some(&bias), &mut y).unwrap();
            for t in 0..n {
                for r in 0..rows {
                    assert_eq!(
                        y.as_slice()[t * rows + r],
                        plain[t * rows + r] + bias_values[r]
                    );
                }
            }
        }
    }
}

/// `matmul_many` (one quantization, one pool job) gives exactly what
/// separate `matmul` calls give, for repacked, tail-row and float matrices
/// mixed in one call, with and without bias.
#[test]
fn matmul_many_equals_separate_matmuls() {
    let mut rng = rng(9);
    for isa in isas_to_test("matmul_many") {
        let backend = CpuBackend::with_isa(2, isa);
        let k = 96;
        let shapes = [
            (DType::Q4_1, 48),
            (DType::Q8_0, 21),
            (DType::F16, 5),
            (DType::Q4_0, 32),
        ];
        let matrices: Vec<_> = shapes
            .iter()
            .map(|&(dtype, rows)| {
                let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
                backend
                    .matrix(WeightView::new(dtype, rows, k, w).unwrap())
                    .unwrap()
            })
            .collect();
        let bias: Vec<f32> = (0..21).map(|i| i as f32 * 0.25 - 2.0).collect();
        let bias = backend.vector(&bias).unwrap();
        for n in [1usize, 3, 8, 13] {
            let x = CpuActivations::from_values(n, k, &random_activations(&mut rng, n, k)).unwrap();
            let mut outs: Vec<_> = shapes
                .iter()
                .map(|&(_, rows)| backend.activations(n, rows))
                .collect();
            let mut products: Vec<_> = matrices
                .iter()
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(i, (w, out))| MatmulProduct {
                    w,
                    bias: (i == 1).then_some(&bias),
                    out,
                    accumulate: false,
                })
                .collect();
            backend
                .matmul_many(MatmulInput::Rows(&x), &mut products)
                .unwrap();
            for (i, (w, out)) in matrices.iter().zip(&outs).enumerate() {
                let mut want = backend.activations(n, shapes[i].1);
                let b = (i == 1).then_some(&bias);
                backend.matmul(&x, w, b, &mut want).unwrap();
                assert_eq!(out.as_slice(), want.as_slice(), "{isa} matrix {i} n={n}");
            }
        }
    }
}

/// A batch of activation rows (register-tiled kernels, 16-row groups of
/// repacked matrices) gives, row for row, what a matrix-vector product of
/// that row alone gives. The integer block sums are exact and each output
/// takes the same f32 operations in the same order either way, so the
/// results must be equal bit for bit. The batch sizes leave every tail a
/// tile walk takes (a speculative verify step is 2-9 rows): 5, 7 and 14
/// (8 + 6) rows of a repacked matrix and 13 (8 + 4 + 1) and 14 (8 + 4 +
/// 2) of a per-row one.
#[test]
fn matmul_rows_equal_matvec_per_row() {
    let mut rng = rng(21);
    for isa in isas_to_test("matmul_vs_matvec") {
        let backend = CpuBackend::with_isa(2, isa);
        for dtype in DType::ALL {
            for n in [5, 7, 11, 13, 14] {
                let (rows, k) = (37, 512);
                let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
                let x = random_activations(&mut rng, n, k);
                let batch = run(&backend, dtype, &w, rows, k, &x, n);
                for t in 0..n {
                    let single = run(&backend, dtype, &w, rows, k, &x[t * k..(t + 1) * k], 1);
                    assert_eq!(
                        &batch[t * rows..(t + 1) * rows],
                        &single[..],
                        "{isa} {dtype}: row {t} of a batch of {n} differs from its matvec"
                    );
                }
            }
        }
    }
}

/// Batches of 1 to 80 rows (on an AMX host, from 64 rows: whole 16-row
/// tiles on AMX-INT8, the rows left on the VNNI tiles; below: all on the
/// VNNI tiles; a verify step's 2-17 rows, a prompt's tail) give, row for
/// row, what the
/// matrix-vector product of that row alone gives, bit for bit, with a
/// bias and as a residual add: every packed type. Greedy decoding with
/// and without speculation stays the same only while this holds.
#[test]
fn prompt_batches_equal_matvec_per_row() {
    let mut rng = rng(23);
    for isa in isas_to_test("prompt batch vs matvec") {
        let backend = CpuBackend::with_isa(2, isa);
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::IQ4NL,
            DType::Q4K,
            DType::Q6K,
        ] {
            let (rows, k, n) = (37, 512, 80);
            let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
            let matrix = backend
                .matrix(WeightView::new(dtype, rows, k, w).unwrap())
                .unwrap();
            let bias_values: Vec<f32> = (0..rows).map(|i| i as f32 * 0.5 - 4.0).collect();
            let bias = backend.vector(&bias_values).unwrap();
            let x = random_activations(&mut rng, n, k);
            let start: Vec<f32> = (0..n * rows).map(|i| (i % 13) as f32 - 6.0).collect();
            let product = |x: &[f32], n: usize, bias, accumulate: bool, first: usize| {
                let xa = CpuActivations::from_values(n, k, x).unwrap();
                let mut out =
                    CpuActivations::from_values(n, rows, &start[first * rows..][..n * rows])
                        .unwrap();
                backend
                    .matmul_many(
                        MatmulInput::Rows(&xa),
                        &mut [MatmulProduct {
                            w: &matrix,
                            bias,
                            out: &mut out,
                            accumulate,
                        }],
                    )
                    .unwrap();
                out.as_slice().to_vec()
            };
            for (bias, accumulate) in [(None, false), (Some(&bias), false), (None, true)] {
                let singles: Vec<Vec<f32>> = (0..n)
                    .map(|t| product(&x[t * k..(t + 1) * k], 1, bias, accumulate, t))
                    .collect();
                for batch_rows in 1..=n {
                    let batch = product(&x[..batch_rows * k], batch_rows, bias, accumulate, 0);
                    for (t, single) in singles.iter().take(batch_rows).enumerate() {
                        assert_eq!(
                            &batch[t * rows..(t + 1) * rows],
                            &single[..],
                            "{isa} {dtype} bias {} accumulate {accumulate}: row {t} of {batch_rows}",
                            bias.is_some()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_rejects_mismatched_shapes() {
    let backend = CpuBackend::new(1);
    let w = backend
        .matrix(WeightView::new(DType::Q8_0, 2, 32, Bytes::from(vec![0u8; 68])).unwrap())
        .unwrap();
    let x = backend.activations(1, 64);
    let mut y = backend.activations(1, 2);
    assert!(backend.matmul(&x, &w, None, &mut y).is_err());
    let x = backend.activations(1, 32);
    let mut y = backend.activations(2, 2);
    assert!(backend.matmul(&x, &w, None, &mut y).is_err());
    let bias = backend.vector(&[1.0; 3]).unwrap();
    let mut y = backend.activations(1, 2);
    assert!(backend.matmul(&x, &w, Some(&bias), &mut y).is_err());
}
