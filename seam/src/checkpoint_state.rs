//! What routing weighs for one checkpoint: the engine's live view of it.

use serde::{Deserialize, Serialize};

/// Live state of one checkpoint, as the engine sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CandidateState {
    /// Whether the weights are in device memory (no swap or load needed).
    pub resident: bool,
    /// Requests waiting in this checkpoint's queue.
    pub queue_depth: u32,
    /// Expected wait before this request starts, in milliseconds.
    pub est_queue_wait_ms: f64,
    /// Time to make the checkpoint runnable when it is not resident, in milliseconds.
    pub est_swap_or_load_ms: f64,
    /// Expected time per generated token at current load, in milliseconds.
    pub est_ms_per_token: f64,
    /// False when the checkpoint is failing (load error, repeated step errors).
    pub healthy: bool,
}

impl Default for CandidateState {
    /// Resident, idle and healthy, with no latency estimates.
    fn default() -> Self {
        CandidateState {
            resident: true,
            queue_depth: 0,
            est_queue_wait_ms: 0.0,
            est_swap_or_load_ms: 0.0,
            est_ms_per_token: 0.0,
            healthy: true,
        }
    }
}

impl CandidateState {
    /// Expected latency of a request producing `output_tokens`:
    /// swap or load (when not resident) + queue wait + output tokens × ms per token.
    /// Non-finite or negative estimates count as infinitely slow, so they never pass a
    /// latency limit by accident.
    pub fn expected_latency_ms(&self, output_tokens: u64) -> f64 {
        let load = if self.resident {
            0.0
        } else {
            self.est_swap_or_load_ms
        };
        let total = load + self.est_queue_wait_ms + output_tokens as f64 * self.est_ms_per_token;
        if total.is_finite() && total >= 0.0 {
            total
        } else {
            f64::INFINITY
        }
    }
}

/// The live state of one checkpoint, kept between requests by the router (the policy
/// holds one per checkpoint). It must stay correct as the checkpoint loads, unloads and
/// fills its queue, and must be cheap and non-blocking.
pub trait CheckpointProbe: Send + Sync {
    /// The state now.
    fn state(&self) -> CandidateState;
}
