//! Engine-aware scoring: the policy crate's [`EngineView`] over an [`InferenceBackend`].
//!
//! Routing asks about every candidate of every request. Looking each one up by name
//! (a lock and a hash per candidate) cost more than the rest of the decision with a
//! hundred models, so the view keeps the backend's [`CheckpointProbe`] for each
//! checkpoint in the policy's [`switchyard_policies::ProbeCell`], fetched on first use,
//! and reads live state through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_policies::{CandidateState, CheckpointKey, EngineView};

use switchyard_seam::InferenceBackend;

/// Reads live checkpoint state from the backend for scoring; a backend that reports
/// nothing ([`InferenceBackend::checkpoint_state`] returns `None`) counts as resident,
/// idle and healthy ([`CandidateState::default`]).
#[derive(Clone)]
pub struct BackendEngineView {
    backend: Arc<dyn InferenceBackend>,
    /// Which probes in a policy's cells are this view's (another view over another
    /// backend must not read them).
    id: u64,
}

impl BackendEngineView {
    /// A view over `backend`.
    pub fn new(backend: Arc<dyn InferenceBackend>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        BackendEngineView {
            backend,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl EngineView for BackendEngineView {
    fn state(&self, model: &str, version: &str) -> CandidateState {
        self.backend
            .checkpoint_state(model, Some(version))
            .unwrap_or_default()
    }

    fn state_at(&self, key: &CheckpointKey<'_>) -> CandidateState {
        if let Some(probe) = key.probe.get(self.id) {
            return probe.state();
        }
        // Not known yet (or not registered at all): a version registered later gets its
        // probe on a later request, so only found probes are kept.
        match self.backend.checkpoint_probe(key.model, key.version) {
            Some(probe) => {
                let state = probe.state();
                key.probe.set(self.id, probe);
                state
            }
            None => self.state(key.model, key.version),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Mutex;

    use super::*;
    use switchyard_policies::ProbeCell;
    use switchyard_seam::CheckpointProbe;
    use switchyard_seam::{BackendError, GenerationRequest, GenerationStream, ModelCard};

    /// A backend whose one checkpoint `a@1` has a live queue depth, registered on demand,
    /// counting the probes and name lookups routing asks for.
    #[derive(Default)]
    struct Counting {
        registered: AtomicBool,
        queue: Arc<AtomicU32>,
        probes: Mutex<u32>,
        lookups: Mutex<u32>,
    }

    struct QueueProbe(Arc<AtomicU32>);

    impl CheckpointProbe for QueueProbe {
        fn state(&self) -> CandidateState {
            CandidateState {
                queue_depth: self.0.load(Ordering::SeqCst),
                ..CandidateState::default()
            }
        }
    }

    impl InferenceBackend for Counting {
        fn models(&self) -> Vec<ModelCard> {
            Vec::new()
        }

        fn ready(&self) -> bool {
            true
        }

        fn submit(&self, _: GenerationRequest) -> Result<GenerationStream, BackendError> {
            Err(BackendError::Overloaded)
        }

        fn checkpoint_state(&self, _: &str, _: Option<&str>) -> Option<CandidateState> {
            *self.lookups.lock().unwrap() += 1;
            Some(CandidateState {
                resident: false,
                ..CandidateState::default()
            })
        }

        fn checkpoint_probe(&self, _: &str, _: &str) -> Option<Arc<dyn CheckpointProbe>> {
            *self.probes.lock().unwrap() += 1;
            self.registered
                .load(Ordering::SeqCst)
                .then(|| Arc::new(QueueProbe(Arc::clone(&self.queue))) as Arc<dyn CheckpointProbe>)
        }
    }

    fn key(cell: &ProbeCell) -> CheckpointKey<'_> {
        CheckpointKey {
            model: "a",
            version: "1",
            probe: cell,
        }
    }

    #[test]
    fn probes_are_kept_per_checkpoint_and_read_live() {
        let backend = Arc::new(Counting::default());
        let view = BackendEngineView::new(backend.clone());
        let cell = ProbeCell::default();
        // Not registered yet: answered by name each time, nothing kept.
        assert!(!view.state_at(&key(&cell)).resident);
        assert!(!view.state_at(&key(&cell)).resident);
        assert_eq!(*backend.lookups.lock().unwrap(), 2);
        // Registered: the probe is fetched once and read live from then on.
        backend.registered.store(true, Ordering::SeqCst);
        backend.queue.store(3, Ordering::SeqCst);
        assert_eq!(view.state_at(&key(&cell)).queue_depth, 3);
        backend.queue.store(5, Ordering::SeqCst);
        assert_eq!(view.state_at(&key(&cell)).queue_depth, 5);
        assert_eq!(*backend.probes.lock().unwrap(), 3);
        assert_eq!(*backend.lookups.lock().unwrap(), 2);
        // Another view (another backend) does not read this view's probe.
        let other = Arc::new(Counting::default());
        let other_view = BackendEngineView::new(other.clone());
        assert!(!other_view.state_at(&key(&cell)).resident);
        assert_eq!(*other.lookups.lock().unwrap(), 1);
        assert_eq!(view.state_at(&key(&cell)).queue_depth, 5);
    }
}
