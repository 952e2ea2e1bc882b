//! Why the engine refused or failed a generation.

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
    /// The tenant's requests already fill its part of the engine (the policy's
    /// `kv_share`); other tenants are still served. Retry when some have finished.
    #[error("Too many of this tenant's requests are waiting: {message}")]
    TenantBusy {
        /// How many wait, and what to do.
        message: String,
    },
    /// The model is served here but cannot run this request yet: a LoRA adapter
    /// being loaded again, or waiting for room in the adapter budget while the
    /// adapters there are in use. Retry after `retry_after_secs`.
    #[error("The model is not available yet: {message}")]
    Unavailable {
        /// What it waits for.
        message: String,
        /// Seconds the client should wait before retrying (at least 1).
        retry_after_secs: u64,
    },
    /// A parameter only the engine can check (it needs the tokenizer or the model).
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

impl BackendError {
    /// An [`BackendError::InvalidRequest`] naming `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        BackendError::InvalidRequest {
            param: param.to_owned(),
            message: message.into(),
        }
    }
}
