//! The engine's front door: one [`Engine`] takes a generation request as the
//! router sends it ([`switchyard_seam::GenerationRequest`]) and returns its
//! stream of events.
//!
//! A request's path through it reads in one direction:
//! [`resolve`](Engine::submit) the model spec to one resident version,
//! [`prepare`] the sequence (template, tokens, context and parameter checks),
//! hand it to the [`Executor`], and let an [`events::StreamSink`] turn the
//! executor's events into the seam's as they come. A request runs to its end
//! on the version it resolved to, whatever is activated meanwhile.

mod embed;
mod events;
mod model_cards;
mod prepare;
mod routing_state;

use std::sync::Arc;

use switchyard_kernels::Backend;
use switchyard_seam::{
    BackendError, CandidateState, CheckpointProbe, CheckpointRef, EmbeddingReply, EmbeddingRequest,
    GenerationRequest, GenerationStream, InferenceBackend, ModelCard, ModelSpec,
};
use tokio::sync::mpsc;

use crate::registry::{Registry, RegistryErrorKind};
use crate::serving::{CheckpointHandle, Executor, SubmitError};

pub use prepare::prepare;

/// Every served model version and the one executor that runs them.
pub struct Engine<B: Backend> {
    registry: Arc<Registry<B>>,
    executor: Executor<B>,
    /// Unix seconds when the models were made available (for `/v1/models`).
    created: u64,
}

impl<B: Backend> Engine<B> {
    /// An engine over `registry`'s versions, run by `executor`.
    pub fn new(registry: Arc<Registry<B>>, executor: Executor<B>, created: u64) -> Self {
        Engine {
            registry,
            executor,
            created,
        }
    }

    /// The registry of versions (for the admin API).
    pub fn registry(&self) -> &Arc<Registry<B>> {
        &self.registry
    }

    /// The executor (for the admin API's status and metrics).
    pub fn executor(&self) -> &Executor<B> {
        &self.executor
    }

    /// The resident version `spec` (a name, an alias or one checkpoint) names now.
    /// An adapter the adapter budget evicted is loaded again in the
    /// background, and the request told to retry (503 with `Retry-After`):
    /// it never waits for the load on an async worker.
    fn resolve(&self, spec: &ModelSpec) -> Result<CheckpointHandle<B>, BackendError> {
        self.registry
            .resolve_or_reload(spec)
            .map_err(|e| match e.kind {
                RegistryErrorKind::NotFound => BackendError::UnknownModel {
                    model: spec.to_string(),
                },
                RegistryErrorKind::Unavailable => BackendError::Unavailable {
                    message: e.message,
                    retry_after_secs: RELOAD_RETRY_AFTER_SECS,
                },
                _ => BackendError::invalid("model", e.message),
            })
    }
}

/// The `Retry-After` of a request for an adapter being loaded again: a
/// rank-8 adapter of a small model loads in well under a second; a client
/// that comes back early is told again.
const RELOAD_RETRY_AFTER_SECS: u64 = 1;

impl<B: Backend> InferenceBackend for Engine<B> {
    fn models(&self) -> Vec<ModelCard> {
        model_cards::model_cards(&self.registry, self.created)
    }

    fn ready(&self) -> bool {
        self.executor.is_running() && !self.registry.active().is_empty()
    }

    fn healthy(&self) -> bool {
        self.executor.is_running()
    }

    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, BackendError> {
        let checkpoint = self.resolve(&request.model)?;
        let (sender, receiver) = mpsc::channel(switchyard_seam::EVENT_BUFFER);
        let sequence = prepare(&checkpoint, &request, sender)?;
        let fanout = usize::try_from(request.fanout).unwrap_or(usize::MAX);
        self.executor
            .check_share(&checkpoint, &sequence, fanout)
            .and_then(|()| self.executor.submit(&checkpoint, sequence))
            .map_err(|error| refusal(error, request.prompt_field()))?;
        Ok(receiver)
    }

    fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingReply, BackendError> {
        let checkpoint = self.resolve(&request.model)?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let sequence = embed::prepare_embedding(&checkpoint, &request, sender)?;
        self.executor
            .submit(&checkpoint, sequence)
            .map_err(|error| match error {
                // Its cache holds the input alone: the input is what to shorten.
                SubmitError::KvBudget { .. } => {
                    BackendError::invalid(embed::INPUT, error.to_string())
                }
                error => refusal(error, embed::INPUT),
            })?;
        Ok(receiver)
    }

    fn encode_prompt(&self, request: &GenerationRequest) -> Option<Result<Vec<u32>, BackendError>> {
        Some(self.resolve(&request.model).and_then(|checkpoint| {
            crate::prompt::encode_with_tools(
                &request.prompt,
                &request.tools,
                request.answer_prefix.as_deref(),
                &checkpoint.tokenizer,
                &checkpoint.template,
            )
            .map_err(|error| BackendError::invalid(request.prompt_field(), error.to_string()))
        }))
    }

    fn checkpoint_state(&self, model: &str, version: Option<&str>) -> Option<CandidateState> {
        let state = self.registry.routing_state(model, version)?;
        Some(routing_state::candidate_state(
            state,
            &self.executor.pulse(),
        ))
    }

    fn checkpoint_probe(&self, model: &str, version: &str) -> Option<Arc<dyn CheckpointProbe>> {
        let live = self.registry.live(model, version)?;
        Some(Arc::new(routing_state::SlotProbe::new(
            live,
            self.executor.pulse(),
        )))
    }

    fn pin_model(&self, model: &ModelSpec) -> Option<CheckpointRef> {
        let checkpoint = self.registry.resolve_spec(model).ok()?;
        Some(checkpoint.id.clone())
    }
}

/// The seam's words for an executor's refusal of a request whose prompt is in
/// `prompt_field`.
fn refusal(error: SubmitError, prompt_field: &str) -> BackendError {
    match error {
        SubmitError::Overloaded { .. } => BackendError::Overloaded,
        SubmitError::Stopped => BackendError::Internal {
            message: error.to_string(),
        },
        // `prepare` refuses it first, with the request's own numbers.
        SubmitError::EmptyPrompt => BackendError::invalid(prompt_field, error.to_string()),
        SubmitError::KvBudget {
            prompt_too_long: true,
            ..
        } => BackendError::invalid(prompt_field, error.to_string()),
        SubmitError::KvBudget { .. } => BackendError::invalid("max_tokens", error.to_string()),
        SubmitError::KvShare { .. } => BackendError::invalid("n", error.to_string()),
        SubmitError::TenantKvShare { fanout, .. } => {
            let field = if fanout > 1 { "n" } else { "max_tokens" };
            BackendError::invalid(field, error.to_string())
        }
        SubmitError::TenantQueueFull { .. } => BackendError::TenantBusy {
            message: error.to_string(),
        },
    }
}
