//! The seam between the HTTP layer and the inference engine.
//!
//! The router knows the engine only through [`InferenceBackend`]: list the
//! models, say whether it is ready, and submit one generation that streams
//! [`GenerationEvent`]s back. Everything OpenAI-specific (wire shapes, `n`,
//! SSE framing, error bodies) stays on the router side; tokenizing, chat
//! templates, stop strings and sampling stay on the engine side.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use switchyard_policies::CheckpointProbe;

use tokio::sync::mpsc;

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

    /// Live state of checkpoint `model` (at `version`, when the policy names one) for
    /// engine-aware routing: residency, queue depth, expected waits, health.
    ///
    /// Must be cheap (it runs for every candidate of every routed request) and must not
    /// block. `None` (the default) means "no information": the policy then treats the
    /// checkpoint as resident, idle and healthy.
    fn checkpoint_state(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Option<switchyard_policies::CandidateState> {
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

    /// The checkpoint `model` (a name or an alias) resolves to now, as
    /// `name@version`, so that every generation of one request runs on one
    /// version and the response can name it (as OpenAI names the snapshot
    /// behind an alias). The default, and any name the backend cannot
    /// resolve, is `model` unchanged (the submit then reports the problem).
    fn pin_model(&self, model: &str) -> String {
        model.to_owned()
    }
}

/// One model as listed by `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCard {
    /// The name clients put in the `model` field.
    pub id: String,
    /// Unix seconds when the model was made available.
    pub created: u64,
    /// Who owns the model (OpenAI's `owned_by`).
    pub owned_by: String,
    /// The model's context window in tokens (prompt plus completion).
    pub context_length: u32,
}

/// One generation: a single prompt producing a single completion.
///
/// OpenAI's `n > 1` and multi-prompt completions are fanned out by the router
/// into several `GenerationRequest`s.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The request id (`x-request-id`), with `/<index>` appended when the
    /// router fans one HTTP request out into several generations.
    pub request_id: String,
    /// The model name exactly as the client sent it.
    pub model: String,
    /// What to continue.
    pub prompt: Prompt,
    /// Most tokens to generate; `None` means up to the end of the context.
    pub max_tokens: Option<u32>,
    /// How to pick tokens.
    pub sampling: SamplingOptions,
    /// Strings that end the generation (at most 4); the engine strips the
    /// matched stop string from the output and reports `FinishReason::Stop`.
    pub stop: Vec<String>,
    /// `None`: no log-probabilities. `Some(k)`: report the sampled token's
    /// log-probability and the `k` most likely alternatives (k <= 20).
    pub logprobs: Option<u8>,
    /// The end user's id, for abuse tracking and logs (OpenAI's `user`).
    pub user: Option<String>,
}

/// The input of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// A conversation; the engine applies the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Raw text; the engine tokenizes it as is.
    Text(String),
    /// Already tokenized input.
    Tokens(Vec<u32>),
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: Role,
    /// The text of the turn (OpenAI content parts are concatenated).
    pub content: String,
}

/// The speaker of a chat turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Instructions from the deployer.
    System,
    /// OpenAI's newer name for system instructions; templates without a
    /// developer role should treat it as `System`.
    Developer,
    /// The end user.
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// The role's name as OpenAI and chat templates spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Sampling parameters, already range-checked by the router.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SamplingOptions {
    /// In [0, 2]; 0 means greedy. `None`: the engine's default (1.0).
    pub temperature: Option<f32>,
    /// In (0, 1]. `None`: 1.0.
    pub top_p: Option<f32>,
    /// Seed for a reproducible sample; `None`: random.
    pub seed: Option<u64>,
    /// In [-2, 2]; 0 when absent.
    pub presence_penalty: f32,
    /// In [-2, 2]; 0 when absent.
    pub frequency_penalty: f32,
    /// Token id to bias in [-100, 100], added to the logit before sampling.
    pub logit_bias: BTreeMap<u32, f32>,
}

/// What a generation reports, in order: zero or more `Token`s, then exactly
/// one `Done` or `Error`, after which the sender is dropped.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// One generated token.
    Token(GeneratedToken),
    /// The generation finished normally.
    Done {
        /// Why it stopped.
        finish_reason: FinishReason,
        /// Token counts, as the engine measured them.
        usage: Usage,
    },
    /// The generation failed after it was accepted.
    Error(BackendError),
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The text this token adds to the output. May be empty while a UTF-8
    /// character spans several tokens, or when the token is part of a stop
    /// string that is being held back.
    pub text: String,
    /// The token id.
    pub id: u32,
    /// The sampled token's log-probability, when logprobs were asked for.
    pub logprob: Option<f32>,
    /// The most likely alternatives, best first, when logprobs were asked for.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    /// The token's text.
    pub text: String,
    /// The token id.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context window.
    Length,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt after templating.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

/// The receiving end of one generation. Dropping it cancels the generation.
///
/// Unbounded on purpose: a generation sends at most `max_tokens + 1` events,
/// so memory stays bounded, and the engine's scheduler can `send` from any
/// thread without blocking its batch on a slow client. The engine learns of a
/// cancellation from a failed `send` or from `UnboundedSender::is_closed`.
pub type GenerationStream = mpsc::UnboundedReceiver<GenerationEvent>;

/// Why the backend refused or failed a generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The `model` field names no served model.
    #[error("The model `{model}` does not exist; GET /v1/models lists the models served here.")]
    UnknownModel {
        /// The name the client sent.
        model: String,
    },
    /// Prompt plus requested completion do not fit the context window.
    #[error(
        "This model's maximum context length is {context} tokens. However, you requested {total} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion). Please reduce the prompt or max_tokens.",
        total = u64::from(*prompt_tokens) + u64::from(*max_tokens)
    )]
    ContextOverflow {
        /// Tokens in the prompt after templating.
        prompt_tokens: u32,
        /// Tokens requested for the completion (0 when the prompt alone overflows).
        max_tokens: u32,
        /// The model's context window.
        context: u32,
    },
    /// The engine's queue is full; retry later.
    #[error("The engine is overloaded; retry the request later.")]
    Overloaded,
    /// A parameter the router could not check (it needs the tokenizer or the model).
    #[error("Invalid '{param}': {message}")]
    InvalidRequest {
        /// The request field at fault, e.g. `logit_bias`.
        param: String,
        /// What is wrong with it and what is allowed.
        message: String,
    },
    /// An engine bug or resource failure; details are in the engine's logs.
    #[error("The engine failed: {message}")]
    Internal {
        /// What failed.
        message: String,
    },
}
