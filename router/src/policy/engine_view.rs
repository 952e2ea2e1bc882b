//! Engine-aware scoring: the policy crate's [`EngineView`] over an [`InferenceBackend`].

use std::sync::Arc;

use switchyard_policies::{CandidateState, EngineView};

use crate::backend::InferenceBackend;

/// Reads live checkpoint state from the backend for scoring; a backend that reports
/// nothing ([`InferenceBackend::checkpoint_state`] returns `None`) counts as resident,
/// idle and healthy ([`CandidateState::default`]).
#[derive(Clone)]
pub struct BackendEngineView {
    backend: Arc<dyn InferenceBackend>,
}

impl BackendEngineView {
    /// A view over `backend`.
    pub fn new(backend: Arc<dyn InferenceBackend>) -> Self {
        BackendEngineView { backend }
    }
}

impl EngineView for BackendEngineView {
    fn state(&self, model: &str, version: &str) -> CandidateState {
        self.backend
            .checkpoint_state(model, Some(version))
            .unwrap_or_default()
    }
}
