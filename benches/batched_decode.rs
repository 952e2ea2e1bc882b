//! Batched decode: aggregate tokens/s when `B` sequences each decode one
//! token per forward step (B = 1, 4, 16, 64), through the engine's batched
//! forward (`LlamaModel::forward` with one chunk per sequence), on the real
//! test model (SmolLM2-135M Q4_1). Each sequence starts from its own
//! 8-token prompt; a measured iteration is `STEPS` steps. One scratch
//! serves every step, as the engine's executor keeps one.
//!
//! `cargo bench --bench batched_decode -- --noplot`; threads come from
//! `SWITCHYARD_BENCH_THREADS` (default 2). The ratios between batch sizes
//! are better read from `batched_ratio`, which measures the sizes
//! interleaved in one run.

#[path = "support/batched.rs"]
mod batched;
#[path = "support/device.rs"]
mod device;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use batched::{decode_steps, load_model, threads, BATCHES, STEPS};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use device::on_bench_device;
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::Backend;

fn bench_batched(c: &mut Criterion) {
    on_bench_device(threads(), Batched(c));
}

/// The bench on whichever backend `SWITCHYARD_BENCH_DEVICE` names.
struct Batched<'a>(&'a mut Criterion);

impl OnDevice for Batched<'_> {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) {
        bench_on(self.0, &*backend);
    }
}

fn bench_on<B: Backend>(c: &mut Criterion, backend: &B) {
    let model = load_model(backend);
    let scratch = RefCell::new(model.new_scratch(backend));
    let threads = threads();
    let mut group = c.benchmark_group("smollm2-q4_1/batched-decode");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    for batch in BATCHES {
        group.throughput(Throughput::Elements((batch * STEPS) as u64));
        group.bench_function(format!("b{batch}-t{threads}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += decode_steps(backend, &model, &mut scratch.borrow_mut(), batch);
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_batched);
criterion_main!(benches);
