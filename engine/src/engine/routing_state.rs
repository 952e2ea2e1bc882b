//! What routing weighs for one checkpoint, from the registry's view of it and
//! the executor's pace.

use std::sync::Arc;

use switchyard_kernels::Backend;
use switchyard_seam::{CandidateState, CheckpointProbe};

use crate::registry::{LiveSlot, RoutingState, Tier};
use crate::serving::ExecutorPulse;

/// The routing view of a checkpoint in `state` while the executor runs at `pulse`.
pub(super) fn candidate_state(state: RoutingState, pulse: &ExecutorPulse) -> CandidateState {
    let RoutingState {
        tier,
        bytes,
        queued,
    } = state;
    let step_ms = pulse.step_time().as_secs_f64() * 1e3;
    // Waiting requests start as running sequences finish: roughly one
    // batch slot per step.
    CandidateState {
        resident: tier.is_resident(),
        queue_depth: u32::try_from(queued).unwrap_or(u32::MAX),
        est_queue_wait_ms: queued as f64 * step_ms,
        est_swap_or_load_ms: swap_or_load_ms(tier, bytes),
        est_ms_per_token: step_ms,
        healthy: pulse.is_running(),
    }
}

/// Bytes a copy moves per millisecond: pinned host memory to a GPU over
/// PCIe (~20 GB/s), a file into memory (~1 GB/s).
const HOST_TO_DEVICE_BYTES_PER_MS: f64 = 20e6;
const DISK_BYTES_PER_MS: f64 = 1e6;

/// What it costs before a checkpoint in `tier` of `bytes` can run: nothing
/// when resident, a copy up from pinned host memory, or a read of its file.
fn swap_or_load_ms(tier: Tier, bytes: u64) -> f64 {
    match tier {
        Tier::Ram | Tier::Device => 0.0,
        Tier::Host => bytes as f64 / HOST_TO_DEVICE_BYTES_PER_MS,
        Tier::Loading | Tier::Disk => bytes as f64 / DISK_BYTES_PER_MS,
    }
}

/// One version's live state, kept by the router per policy checkpoint.
pub(super) struct SlotProbe<B: Backend> {
    live: Arc<LiveSlot<B>>,
    pulse: ExecutorPulse,
}

impl<B: Backend> SlotProbe<B> {
    pub(super) fn new(live: Arc<LiveSlot<B>>, pulse: ExecutorPulse) -> Self {
        SlotProbe { live, pulse }
    }
}

impl<B: Backend> CheckpointProbe for SlotProbe<B> {
    fn state(&self) -> CandidateState {
        candidate_state(self.live.routing_state(), &self.pulse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routing sees the tiers apart: resident (RAM or GPU) costs nothing,
    /// pinned host memory a copy up, disk a read.
    #[test]
    fn each_tier_has_its_cost_before_a_checkpoint_runs() {
        let bytes = 4_000_000_000;
        assert_eq!(swap_or_load_ms(Tier::Device, bytes), 0.0);
        assert_eq!(swap_or_load_ms(Tier::Ram, bytes), 0.0);
        let host = swap_or_load_ms(Tier::Host, bytes);
        let disk = swap_or_load_ms(Tier::Disk, bytes);
        assert!((host - 200.0).abs() < 1e-9, "{host}");
        assert!((disk - 4000.0).abs() < 1e-9, "{disk}");
        assert_eq!(swap_or_load_ms(Tier::Loading, bytes), disk);
        let resident: Vec<Tier> = [
            Tier::Ram,
            Tier::Device,
            Tier::Host,
            Tier::Loading,
            Tier::Disk,
        ]
        .into_iter()
        .filter(|t| t.is_resident())
        .collect();
        assert_eq!(resident, [Tier::Ram, Tier::Device]);
    }

    /// A loaded checkpoint is in RAM on the CPU backend (the CUDA
    /// backend's `DEVICE_MEMORY` is checked in the kernels' tests).
    #[test]
    fn a_loaded_checkpoint_is_in_its_backends_memory() {
        assert_eq!(
            Tier::resident::<switchyard_kernels::cpu::CpuBackend>(),
            Tier::Ram
        );
    }
}
