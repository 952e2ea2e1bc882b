//! `matmul_many` with an elementwise step (RMS norm, SiLU or GELU gating) and
//! accumulating products gives, bit for bit, what the unfused calls give:
//! the step on its own, `matmul` into a buffer, then `add`. Run on every
//! ISA, on 1 and 2 threads, at row counts that leave partial tiles, with
//! quantized-only products (the fused job) and with a float matrix among
//! them (the step runs alone first).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use common::{isas_to_test, random_activations, random_weights, rng};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, CpuMatrix};
use switchyard_kernels::{Backend, DType, MatmulInput, MatmulProduct, WeightView};

/// Width of the 32-element types' cases: three blocks, an odd count.
const K: usize = 96;
/// Width of the K types' cases: three 256-element blocks.
const K_WIDE: usize = 768;

/// Which step makes the products' input.
#[derive(Clone, Copy, Debug)]
enum Step {
    Rows,
    RmsNorm,
    SiluMul,
    GeluMul,
}

fn matrices(
    backend: &CpuBackend,
    shapes: &[(DType, usize)],
    seed: u64,
    k: usize,
) -> Vec<CpuMatrix> {
    let mut rng = rng(seed);
    shapes
        .iter()
        .map(|&(dtype, rows)| {
            let w = Bytes::from(random_weights(&mut rng, dtype, rows, k));
            backend
                .matrix(WeightView::new(dtype, rows, k, w).unwrap())
                .unwrap()
        })
        .collect()
}

/// Runs `step` and the products fused (`fused == true`) or one call at a
/// time; returns the step's rows and every product's output.
fn run(
    backend: &CpuBackend,
    step: Step,
    fused: bool,
    n: usize,
    matrices: &[CpuMatrix],
    seed: u64,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut rng = rng(seed);
    let k = matrices[0].cols();
    let x = CpuActivations::from_values(n, k, &random_activations(&mut rng, n, k)).unwrap();
    let up = CpuActivations::from_values(n, k, &random_activations(&mut rng, n, k)).unwrap();
    let weight: Vec<f32> = (0..k).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
    let weight = backend.vector(&weight).unwrap();
    let bias: Vec<f32> = (0..matrices[1].rows())
        .map(|i| i as f32 * 0.25 - 2.0)
        .collect();
    let bias = backend.vector(&bias).unwrap();
    // Accumulating products start from nonzero residuals.
    let mut outs: Vec<CpuActivations> = matrices
        .iter()
        .map(|w| {
            let start: Vec<f32> = (0..n * w.rows()).map(|i| (i % 11) as f32 - 5.0).collect();
            CpuActivations::from_values(n, w.rows(), &start).unwrap()
        })
        .collect();
    let accumulate = |i: usize| i != 0;
    let bias_of = |i: usize| (i == 1).then_some(&bias);
    let mut made = backend.activations(n, k);
    let mut gate = x.clone();
    if fused {
        let input = match step {
            Step::Rows => MatmulInput::Rows(&x),
            Step::RmsNorm => MatmulInput::RmsNorm {
                x: &x,
                weight: &weight,
                eps: 1e-5,
                out: &mut made,
            },
            Step::SiluMul => MatmulInput::SiluMul {
                gate: &mut gate,
                up: &up,
            },
            Step::GeluMul => MatmulInput::GeluMul {
                gate: &mut gate,
                up: &up,
            },
        };
        let mut products: Vec<_> = matrices
            .iter()
            .zip(outs.iter_mut())
            .enumerate()
            .map(|(i, (w, out))| MatmulProduct {
                w,
                bias: bias_of(i),
                out,
                accumulate: accumulate(i),
            })
            .collect();
        backend.matmul_many(input, &mut products).unwrap();
    } else {
        match step {
            Step::Rows => {}
            Step::RmsNorm => backend.rms_norm(&x, &weight, 1e-5, &mut made).unwrap(),
            Step::SiluMul => backend.silu_mul(&mut gate, &up).unwrap(),
            Step::GeluMul => backend.gelu_mul(&mut gate, &up).unwrap(),
        }
        let input = match step {
            Step::Rows => &x,
            Step::RmsNorm => &made,
            Step::SiluMul | Step::GeluMul => &gate,
        };
        for (i, (w, out)) in matrices.iter().zip(outs.iter_mut()).enumerate() {
            if accumulate(i) {
                let mut product = backend.activations(n, w.rows());
                backend.matmul(input, w, bias_of(i), &mut product).unwrap();
                backend.add(out, &product).unwrap();
            } else {
                backend.matmul(input, w, bias_of(i), out).unwrap();
            }
        }
    }
    let rows = match step {
        Step::Rows => x.as_slice().to_vec(),
        Step::RmsNorm => made.as_slice().to_vec(),
        Step::SiluMul | Step::GeluMul => gate.as_slice().to_vec(),
    };
    (rows, outs.iter().map(|o| o.as_slice().to_vec()).collect())
}

#[test]
fn fused_steps_and_accumulation_equal_the_separate_calls() {
    let quantized = [(DType::Q4_1, 48), (DType::Q8_0, 21), (DType::Q4_0, 37)];
    let k_types = [(DType::Q4K, 35), (DType::Q6K, 19), (DType::Q5_0, 16)];
    let mixed = [(DType::Q4_1, 48), (DType::Q8_0, 21), (DType::F16, 5)];
    for isa in isas_to_test("fused matmul inputs") {
        for threads in [1, 2] {
            let backend = CpuBackend::with_isa(threads, isa);
            for (shapes, seed, k) in [(&quantized, 3u64, K), (&mixed, 4, K), (&k_types, 5, K_WIDE)]
            {
                let matrices = matrices(&backend, shapes, seed, k);
                for step in [Step::Rows, Step::RmsNorm, Step::SiluMul, Step::GeluMul] {
                    for n in [1usize, 3, 8, 13, 17] {
                        let seed = n as u64 * 31 + seed;
                        let fused = run(&backend, step, true, n, &matrices, seed);
                        let apart = run(&backend, step, false, n, &matrices, seed);
                        let what = format!("{isa} {threads}t {step:?} n={n} {shapes:?}");
                        assert_eq!(fused.0, apart.0, "step rows, {what}");
                        for (i, (f, a)) in fused.1.iter().zip(&apart.1).enumerate() {
                            assert_eq!(f, a, "product {i}, {what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_steps_reject_mismatched_operands() {
    let backend = CpuBackend::new(1);
    let matrices = matrices(&backend, &[(DType::Q8_0, 16)], 5, K);
    let x = backend.activations(2, K);
    let mut out = backend.activations(2, 16);
    let short = backend.vector(&[1.0; K - 1]).unwrap();
    let mut made = backend.activations(2, K);
    let mut products = [MatmulProduct {
        w: &matrices[0],
        bias: None,
        out: &mut out,
        accumulate: false,
    }];
    let input = MatmulInput::RmsNorm {
        x: &x,
        weight: &short,
        eps: 1e-5,
        out: &mut made,
    };
    assert!(backend.matmul_many(input, &mut products).is_err());
    let mut gate = backend.activations(2, K);
    let up = backend.activations(3, K);
    let input = MatmulInput::SiluMul {
        gate: &mut gate,
        up: &up,
    };
    assert!(backend.matmul_many(input, &mut products).is_err());
    let input = MatmulInput::GeluMul {
        gate: &mut gate,
        up: &up,
    };
    assert!(backend.matmul_many(input, &mut products).is_err());
}
