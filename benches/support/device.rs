//! The device a bench runs on: `SWITCHYARD_BENCH_DEVICE` (cpu, cuda,
//! cuda:N; default cpu), its backend built by the kernels' one wiring
//! module (`switchyard_kernels::device`), so a bench is written once over
//! `Backend` and names no backend of its own. `SWITCHYARD_BENCH_ATTENTION`
//! (f32, bf16; default f32) sets attention's products on the CPU.

use switchyard_kernels::device::{on_device_with, Device, OnDevice};
use switchyard_kernels::AttentionPrecision;

/// `SWITCHYARD_BENCH_DEVICE`, or the CPU.
pub fn device() -> Device {
    match std::env::var("SWITCHYARD_BENCH_DEVICE") {
        Ok(name) => name
            .parse()
            .unwrap_or_else(|e| panic!("SWITCHYARD_BENCH_DEVICE: {e}")),
        Err(_) => Device::Cpu,
    }
}

/// `SWITCHYARD_BENCH_ATTENTION`, or f32.
pub fn attention() -> AttentionPrecision {
    match std::env::var("SWITCHYARD_BENCH_ATTENTION") {
        Ok(name) => name
            .parse()
            .unwrap_or_else(|e| panic!("SWITCHYARD_BENCH_ATTENTION: {e}")),
        Err(_) => AttentionPrecision::F32,
    }
}

/// Runs `work` on the bench device's backend (`threads` worker threads on
/// the CPU); a device that cannot be opened ends the bench with why.
pub fn on_bench_device<W: OnDevice>(threads: usize, work: W) -> W::Output {
    on_device_with(device(), threads, attention(), work).unwrap_or_else(|e| panic!("{e}"))
}
