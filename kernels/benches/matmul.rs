//! Matrix-vector (decode) and matrix-matrix (n = 64, prefill) products on
//! SmolLM2-135M shapes, Q4_1 and Q8_0, on 1 and 2 threads: the best ISA
//! (AVX-512 VNNI: 16-row repacked groups) against AVX-512 without VNNI (the
//! per-row kernels) as the peer in the same run. Throughput is weight bytes
//! per second.
//!
//! `cargo bench -p switchyard-kernels --bench matmul -- 'matvec/q4_1/1536x576'`
#![allow(clippy::unwrap_used)] // a benchmark over inputs it builds itself

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, Isa};
use switchyard_kernels::{Backend, DType, WeightView};

/// (output rows, input columns): q/o, k/v, gate/up, down, tied lm_head.
const SHAPES: [(usize, usize); 5] = [
    (576, 576),
    (192, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
];

fn bench(c: &mut Criterion) {
    let mut rng = common::rng(1);
    let best = Isa::detect();
    for (name, n) in [("matvec", 1usize), ("matmul16", 16), ("matmul64", 64)] {
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for dtype in [DType::Q4_1, DType::Q8_0] {
            for (rows, k) in SHAPES {
                let bytes = Bytes::from(common::random_weights(&mut rng, dtype, rows, k));
                group.throughput(Throughput::Bytes(bytes.len() as u64));
                let x_values = common::random_activations(&mut rng, n, k);
                let peer = Isa::Avx512.min(best);
                let isas = if peer == best {
                    vec![best]
                } else {
                    vec![peer, best]
                };
                for isa in isas {
                    for threads in [1, 2] {
                        let backend = CpuBackend::with_isa(threads, isa);
                        let w = backend
                            .matrix(
                                WeightView::new(dtype, rows, k, bytes.clone()).expect("weights"),
                            )
                            .expect("matrix");
                        let x = CpuActivations::from_values(n, k, &x_values).unwrap();
                        let mut y = backend.activations(n, rows);
                        let id = BenchmarkId::new(
                            format!("{dtype}/{rows}x{k}"),
                            format!("{}/t{threads}", backend.isa()),
                        );
                        group.bench_function(id, |b| {
                            b.iter(|| backend.matmul(&x, &w, None, &mut y).expect("matmul"))
                        });
                    }
                }
            }
        }
        group.finish();
    }
}

/// The cost of one pool dispatch of eight empty tasks: the floor under
/// every parallel kernel call.
fn dispatch(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for threads in [1, 2] {
        let backend = CpuBackend::new(threads);
        group.bench_function(format!("dispatch8/t{threads}"), |b| {
            b.iter(|| {
                backend.pool().run(8, &|i| {
                    std::hint::black_box(i);
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, dispatch, bench);
criterion_main!(benches);
