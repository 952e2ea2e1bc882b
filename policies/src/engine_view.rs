//! The live engine state scoring needs, behind a small trait the router implements.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

pub use switchyard_seam::{CandidateState, CheckpointProbe};

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
