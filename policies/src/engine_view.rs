//! The live engine state scoring needs, behind a small trait the router implements.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

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

/// The live state of one checkpoint, kept between requests by an engine view (see
/// [`ProbeCell`]). It must stay correct as the checkpoint loads, unloads and fills its
/// queue, and must be cheap and non-blocking.
pub trait CheckpointProbe: Send + Sync {
    /// The state now.
    fn state(&self) -> CandidateState;
}

/// Where an engine view may keep its [`CheckpointProbe`] for one checkpoint of a policy,
/// so that routing does not look every candidate up by name (a lock and a hash each,
/// more than the rest of a decision with a hundred models). A policy holds one per
/// checkpoint; the first view to fill it owns it (by `view` id), others ask by name.
#[derive(Default)]
pub struct ProbeCell(OnceLock<(u64, Arc<dyn CheckpointProbe>)>);

impl ProbeCell {
    /// The probe view `view` kept here, if it did.
    pub fn get(&self, view: u64) -> Option<&dyn CheckpointProbe> {
        self.0
            .get()
            .filter(|(owner, _)| *owner == view)
            .map(|(_, probe)| &**probe)
    }

    /// Keeps `probe` for view `view` unless the cell is taken.
    pub fn set(&self, view: u64, probe: Arc<dyn CheckpointProbe>) {
        let _ = self.0.set((view, probe));
    }
}

impl std::fmt::Debug for ProbeCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let owner = self.0.get().map(|(owner, _)| *owner);
        f.debug_tuple("ProbeCell").field(&owner).finish()
    }
}

/// One checkpoint of a policy as routing asks the engine about it: by name, with the
/// policy's [`ProbeCell`] for it.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointKey<'a> {
    /// Model name.
    pub model: &'a str,
    /// Version name.
    pub version: &'a str,
    /// Where a view may keep its probe for this checkpoint.
    pub probe: &'a ProbeCell,
}

/// Read access to live engine state. The router implements it over the engine; tests and
/// the `explain` command use [`IdleEngine`] or [`StaticEngineView`].
pub trait EngineView {
    /// The state of checkpoint `model@version`. Unknown checkpoints should report
    /// `resident: false` with a load estimate, or `healthy: false` if they cannot load.
    fn state(&self, model: &str, version: &str) -> CandidateState;

    /// The state of the checkpoint `key` names, as [`EngineView::state`] reports it;
    /// routing calls this, and a view may answer from a handle cached per slot.
    fn state_at(&self, key: &CheckpointKey<'_>) -> CandidateState {
        self.state(key.model, key.version)
    }
}

impl<T: EngineView + ?Sized> EngineView for &T {
    fn state(&self, model: &str, version: &str) -> CandidateState {
        (**self).state(model, version)
    }

    fn state_at(&self, key: &CheckpointKey<'_>) -> CandidateState {
        (**self).state_at(key)
    }
}

impl<T: EngineView + ?Sized> EngineView for std::sync::Arc<T> {
    fn state(&self, model: &str, version: &str) -> CandidateState {
        (**self).state(model, version)
    }

    fn state_at(&self, key: &CheckpointKey<'_>) -> CandidateState {
        (**self).state_at(key)
    }
}

/// Every checkpoint resident, idle and healthy.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdleEngine;

impl EngineView for IdleEngine {
    fn state(&self, _model: &str, _version: &str) -> CandidateState {
        CandidateState::default()
    }
}

/// Fixed states keyed by `model@version`, with a default for the rest. Deserializes from
/// JSON such as `{"default": {...}, "checkpoints": {"smol@v1": {"queue_depth": 3}}}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticEngineView {
    /// State of checkpoints not listed.
    pub default: CandidateState,
    /// States by `model@version`.
    pub checkpoints: HashMap<String, CandidateState>,
}

impl EngineView for StaticEngineView {
    fn state(&self, model: &str, version: &str) -> CandidateState {
        // Explain and tests only: the format! is not on the serving path.
        self.checkpoints
            .get(&format!("{model}@{version}"))
            .copied()
            .unwrap_or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_latency_adds_load_queue_and_decode() {
        let s = CandidateState {
            resident: false,
            est_swap_or_load_ms: 50.0,
            est_queue_wait_ms: 20.0,
            est_ms_per_token: 2.0,
            ..CandidateState::default()
        };
        assert_eq!(s.expected_latency_ms(10), 90.0);
        let nan = CandidateState {
            est_ms_per_token: f64::NAN,
            ..s
        };
        assert_eq!(nan.expected_latency_ms(1), f64::INFINITY);
    }

    #[test]
    fn static_view_reads_json() {
        let v: StaticEngineView =
            serde_json::from_str(r#"{"checkpoints": {"a@1": {"queue_depth": 3}}}"#).unwrap();
        assert_eq!(v.state("a", "1").queue_depth, 3);
        assert!(v.state("a", "1").resident);
        assert_eq!(v.state("b", "1"), CandidateState::default());
    }
}
