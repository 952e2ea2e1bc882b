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
    // batch slot per step; a cold version first reads its file (~1 GB/s).
    CandidateState {
        resident: tier == Tier::Ram,
        queue_depth: u32::try_from(queued).unwrap_or(u32::MAX),
        est_queue_wait_ms: queued as f64 * step_ms,
        est_swap_or_load_ms: if tier == Tier::Ram {
            0.0
        } else {
            bytes as f64 / 1e6
        },
        est_ms_per_token: step_ms,
        healthy: pulse.is_running(),
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
