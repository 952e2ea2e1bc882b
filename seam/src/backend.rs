//! The engine as the router sees it.

use std::sync::Arc;

use crate::{
    BackendError, CandidateState, CheckpointProbe, CheckpointRef, EmbeddingReply, EmbeddingRequest,
    GenerationRequest, GenerationStream, ModelCard, ModelSpec,
};

/// The engine as the router sees it.
///
/// Implementations must be cheap to call from async handlers: `submit`
/// validates and enqueues, then returns at once; the work happens elsewhere
/// and reports through the returned [`GenerationStream`].
pub trait InferenceBackend: Send + Sync + 'static {
    /// The models this backend serves, as listed by `GET /v1/models`.
    fn models(&self) -> Vec<ModelCard>;

    /// Whether the backend can take requests now (weights loaded, workers up).
    /// `GET /ready` answers 503 until this is true.
    fn ready(&self) -> bool;

    /// Whether the backend can still serve at all: `false` once a part it cannot run
    /// without has died (the engine's executor thread). `GET /health` answers 503 then,
    /// so that an orchestrator restarts the process. The default is `true`.
    fn healthy(&self) -> bool {
        true
    }

    /// Validates, tokenizes and enqueues one generation.
    ///
    /// Errors that depend only on the request (unknown model, prompt too long,
    /// bad parameter) must be returned here rather than through the stream, so
    /// the router can answer with the right HTTP status before any byte of a
    /// streamed response is sent. Dropping the returned stream cancels the
    /// generation and must free its resources (KV cache, queue slot).
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, BackendError>;

    /// Validates, tokenizes and enqueues one embedding (`POST /v1/embeddings`),
    /// with the same up-front errors as [`InferenceBackend::submit`] (the
    /// input's field is `input`). The default refuses: a backend without
    /// hidden states to pool.
    fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingReply, BackendError> {
        Err(BackendError::invalid(
            "model",
            format!(
                "`{}` cannot compute embeddings on this server's backend",
                request.model
            ),
        ))
    }

    /// The token ids `submit` would run `request`'s prompt as, on `request.model`:
    /// chat template applied and tokenized, the same errors as `submit` for a prompt
    /// that cannot be encoded. The router counts them to reserve a budget for the
    /// prompt's real size before anything runs, then submits them as
    /// [`crate::Prompt::Encoded`]. `None` (the default): the backend cannot tell before
    /// submitting (the router then reserves with its estimate).
    fn encode_prompt(&self, request: &GenerationRequest) -> Option<Result<Vec<u32>, BackendError>> {
        let _ = request;
        None
    }

    /// Live state of checkpoint `model` (at `version`, when the policy names one) for
    /// engine-aware routing: residency, queue depth, expected waits, health.
    ///
    /// Must be cheap (it runs for every candidate of every routed request) and must not
    /// block. `None` (the default) means "no information": the policy then treats the
    /// checkpoint as resident, idle and healthy.
    fn checkpoint_state(&self, model: &str, version: Option<&str>) -> Option<CandidateState> {
        let _ = (model, version);
        None
    }

    /// A handle that answers [`InferenceBackend::checkpoint_state`] for `model@version`
    /// from now on, kept per policy checkpoint by the router so that routing a request
    /// does not look every candidate up by name. `None` (the default) when the backend
    /// has none or does not know the version yet; routing then asks `checkpoint_state`.
    fn checkpoint_probe(&self, model: &str, version: &str) -> Option<Arc<dyn CheckpointProbe>> {
        let _ = (model, version);
        None
    }

    /// The checkpoint `model` (a name or an alias) resolves to now, so that
    /// every generation of one request runs on one version and the response
    /// can name it (as OpenAI names the snapshot behind an alias). `None` (the
    /// default, and any name the backend cannot resolve): submit `model`
    /// unchanged (the submit then reports the problem).
    fn pin_model(&self, model: &ModelSpec) -> Option<CheckpointRef> {
        let _ = model;
        None
    }
}
