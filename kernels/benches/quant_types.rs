//! Decode-relevant matrix-vector throughput of every quantized weight type
//! on the best ISA, one thread: weight bytes per second, so the types
//! compare as a memory-bound decode step sees them (Q4_K and Q6_K, the
//! types most checkpoints already held, are the peers in the same run).
//! A 2048² matrix mostly fits the L2/L3 caches; 4096² (9-30 MB) streams
//! from memory. One prefill-sized case (64 rows) per type shows the
//! batched kernels.
//!
//! `cargo bench -p switchyard-kernels --bench quant_types -- matvec/q5_0`
#![allow(clippy::unwrap_used)] // a benchmark over inputs it builds itself

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchyard_kernels::cpu::{CpuActivations, CpuBackend};
use switchyard_kernels::{Backend, DType, WeightView};

fn bench(c: &mut Criterion) {
    let mut rng = common::rng(1);
    let backend = CpuBackend::new(1);
    for (name, n, shapes) in [
        (
            "matvec",
            1usize,
            &[(2048usize, 2048usize), (4096, 4096)][..],
        ),
        ("matmul64", 64, &[(2048, 2048)][..]),
    ] {
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for dtype in DType::ALL.into_iter().filter(|t| t.is_quantized()) {
            for &(rows, k) in shapes {
                let bytes = Bytes::from(common::random_weights(&mut rng, dtype, rows, k));
                group.throughput(Throughput::Bytes(bytes.len() as u64));
                let w = backend
                    .matrix(WeightView::new(dtype, rows, k, bytes).expect("weights"))
                    .expect("matrix");
                let x =
                    CpuActivations::from_values(n, k, &common::random_activations(&mut rng, n, k))
                        .unwrap();
                let mut y = backend.activations(n, rows);
                let id = BenchmarkId::new(
                    format!("{dtype}/{rows}x{k}"),
                    format!("{}/t1", backend.isa()),
                );
                group.bench_function(id, |b| {
                    b.iter(|| backend.matmul(&x, &w, None, &mut y).expect("matmul"))
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
