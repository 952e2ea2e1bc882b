//! `matmul_chain` (on the CPU one pool job for every stage) gives, bit for
//! bit, what its stages give as `matmul_many` calls one by one: a layer's
//! tail (O product with its residual add; the MLP norm with gate/up; the
//! gating with down and its residual add) and the next layer's norm with
//! Q/K/V and a bias, on every ISA, on 1 and 2 threads, at 1, 3 and 17
//! rows (a partial tile and more rows than a tile). Every buffer of the
//! chain is compared, not only the last outputs.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use common::{isas_to_test, random_activations, random_weights, rng};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, CpuMatrix, CpuVector};
use switchyard_kernels::{
    matmul_stages_one_by_one, Backend, DType, MatmulInput, MatmulProduct, MatmulStage, Slot,
    WeightView,
};

// The chain's buffers.
const ATTN: Slot = Slot(0);
const X: Slot = Slot(1);
const NORMED: Slot = Slot(2);
const GATE: Slot = Slot(3);
const UP: Slot = Slot(4);
const Q: Slot = Slot(5);
const KV: Slot = Slot(6);

/// One layer's weights: `hidden` wide, `inner` in the MLP, each matrix
/// of `dtype` except where `float` puts F16 in gate.
struct Layer {
    wo: CpuMatrix,
    gate: CpuMatrix,
    up: CpuMatrix,
    down: CpuMatrix,
    wq: CpuMatrix,
    wkv: CpuMatrix,
    ffn_norm: CpuVector,
    attn_norm: CpuVector,
    bias: CpuVector,
    hidden: usize,
    inner: usize,
}

fn layer(backend: &CpuBackend, dtype: DType, float: bool, hidden: usize, inner: usize) -> Layer {
    let mut rng = rng(hidden as u64 * 7 + inner as u64);
    let mut matrix = |dtype: DType, rows: usize, cols: usize| {
        let w = Bytes::from(random_weights(&mut rng, dtype, rows, cols));
        backend
            .matrix(WeightView::new(dtype, rows, cols, w).unwrap())
            .unwrap()
    };
    // 40 rows of K/V: two repacked groups and a tail of per-row kernels.
    let kv_rows = 40;
    let norm = |shift: f32| {
        let w: Vec<f32> = (0..hidden).map(|i| shift + (i % 5) as f32 * 0.25).collect();
        backend.vector(&w).unwrap()
    };
    let bias: Vec<f32> = (0..kv_rows).map(|i| i as f32 * 0.125 - 2.0).collect();
    Layer {
        wo: matrix(dtype, hidden, hidden),
        gate: matrix(if float { DType::F16 } else { dtype }, inner, hidden),
        up: matrix(dtype, inner, hidden),
        down: matrix(dtype, hidden, inner),
        wq: matrix(dtype, hidden, hidden),
        wkv: matrix(dtype, kv_rows, hidden),
        ffn_norm: norm(0.5),
        attn_norm: norm(0.75),
        bias: backend.vector(&bias).unwrap(),
        hidden,
        inner,
    }
}

/// The chain's buffers after it ran on `n` rows, fused (`matmul_chain`)
/// or stage by stage.
fn run(backend: &CpuBackend, l: &Layer, n: usize, gelu: bool, fused: bool) -> Vec<Vec<f32>> {
    let mut rng = rng(n as u64 + 1);
    let (hidden, inner) = (l.hidden, l.inner);
    let values = |rng: &mut _, cols| {
        CpuActivations::from_values(n, cols, &random_activations(rng, n, cols)).unwrap()
    };
    let mut attn = values(&mut rng, hidden);
    let mut x = values(&mut rng, hidden);
    // Outputs start from garbage the chain must overwrite.
    let mut normed = values(&mut rng, hidden);
    let mut gate = values(&mut rng, inner);
    let mut up = values(&mut rng, inner);
    let mut q = values(&mut rng, hidden);
    let mut kv = values(&mut rng, l.wkv.rows());
    let product = |w, out, accumulate| MatmulProduct {
        w,
        bias: None,
        out,
        accumulate,
    };
    let o = [product(&l.wo, X, true)];
    let gate_up = [product(&l.gate, GATE, false), product(&l.up, UP, false)];
    let down = [product(&l.down, X, true)];
    let qkv = [
        product(&l.wq, Q, false),
        MatmulProduct {
            w: &l.wkv,
            bias: Some(&l.bias),
            out: KV,
            accumulate: false,
        },
    ];
    let gating = if gelu {
        MatmulInput::GeluMul { gate: GATE, up: UP }
    } else {
        MatmulInput::SiluMul { gate: GATE, up: UP }
    };
    let norm = |weight, out| MatmulInput::RmsNorm {
        x: X,
        weight,
        eps: 1e-5,
        out,
    };
    let stages = [
        MatmulStage {
            input: MatmulInput::Rows(ATTN),
            products: &o,
        },
        MatmulStage {
            input: norm(&l.ffn_norm, NORMED),
            products: &gate_up,
        },
        MatmulStage {
            input: gating,
            products: &down,
        },
        MatmulStage {
            input: norm(&l.attn_norm, NORMED),
            products: &qkv,
        },
    ];
    let mut buffers = [
        &mut attn,
        &mut x,
        &mut normed,
        &mut gate,
        &mut up,
        &mut q,
        &mut kv,
    ];
    if fused {
        backend.matmul_chain(&mut buffers, &stages).unwrap();
    } else {
        matmul_stages_one_by_one(backend, &mut buffers, &stages).unwrap();
    }
    buffers.iter().map(|b| b.as_slice().to_vec()).collect()
}

#[test]
fn a_chain_equals_its_stages_one_by_one() {
    // (type, hidden, inner, a float gate): 32-element blocks and the
    // 256-element K types (K/V's 40 rows leave a tail past the groups).
    let cases = [
        (DType::Q4_1, 128, 160, false),
        (DType::Q8_0, 96, 224, false),
        (DType::Q4_0, 96, 160, false),
        (DType::Q4K, 256, 512, false),
        (DType::Q6K, 256, 512, false),
        // A float matrix: the stages run one by one on the CPU too.
        (DType::Q4_1, 96, 160, true),
    ];
    for isa in isas_to_test("matmul chain") {
        for threads in [1, 2] {
            let backend = CpuBackend::with_isa(threads, isa);
            for &(dtype, hidden, inner, float) in &cases {
                let l = layer(&backend, dtype, float, hidden, inner);
                for n in [1usize, 3, 17] {
                    for gelu in [false, true] {
                        let fused = run(&backend, &l, n, gelu, true);
                        let apart = run(&backend, &l, n, gelu, false);
                        for (slot, (f, a)) in fused.iter().zip(&apart).enumerate() {
                            let what =
                                format!("{isa} {threads}t {dtype} float={float} n={n} gelu={gelu}");
                            assert_eq!(f, a, "buffer {slot}, {what}");
                        }
                    }
                }
            }
        }
    }
}

/// A stage that names one buffer twice (a product writing its own input)
/// or a buffer past the call's is refused before anything runs.
#[test]
fn a_chain_refuses_a_buffer_named_twice_or_missing() {
    let backend = CpuBackend::new(2);
    let l = layer(&backend, DType::Q8_0, false, 96, 160);
    let mut x = backend.activations(2, 96);
    let mut y = backend.activations(2, 96);
    let before = x.as_slice().to_vec();
    for (input, out) in [(X, X), (X, Slot(7))] {
        let products = [MatmulProduct {
            w: &l.wo,
            bias: None,
            out,
            accumulate: true,
        }];
        let stage = |input| MatmulStage {
            input: MatmulInput::Rows(input),
            products: &products,
        };
        let stages = [stage(Slot(0)), stage(input)];
        let mut buffers = [&mut y, &mut x];
        assert!(backend.matmul_chain(&mut buffers, &stages).is_err());
        assert_eq!(x.as_slice(), before.as_slice(), "nothing ran");
    }
}
