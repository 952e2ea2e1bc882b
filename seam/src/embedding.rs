//! One embedding as the router asks for it, and what comes back.
//!
//! An OpenAI `input` of several strings is fanned out by the router into one
//! [`EmbeddingRequest`] each; the engine batches them (and any other request
//! of the same checkpoint) into its forward steps like generations.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::{BackendError, ModelSpec, TenantShare};

/// One text (or token-id sequence) to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingRequest {
    /// The request id (`x-request-id`), with `/<index>` appended per input.
    pub request_id: String,
    /// The model to run: a name, an alias or `name@version`.
    pub model: ModelSpec,
    /// What to embed.
    pub input: EmbeddingInput,
    /// The length the client asked for (OpenAI's `dimensions`); the engine
    /// refuses any other than the model's hidden size, which it cannot shorten.
    pub dimensions: Option<u32>,
    /// Whose request it is and its weight, for fair admission.
    pub share: TenantShare,
    /// When the request must be answered by (the router's request deadline, set once
    /// on arrival, as for generations); `None`: no deadline.
    pub deadline: Option<Instant>,
}

/// The input of one embedding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbeddingInput {
    /// Text; the engine tokenizes it as it tokenizes a completion's prompt
    /// (BOS as the model's file asks).
    Text(String),
    /// Token ids, run as they are.
    Tokens(Vec<u32>),
}

/// A computed embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The mean of the prompt's final hidden states (after the output norm)
    /// scaled to unit L2 norm: `hidden_size` floats.
    pub vector: Vec<f32>,
    /// Tokens the input ran as.
    pub prompt_tokens: u32,
}

/// Where one embedding arrives; dropping it cancels the work.
pub type EmbeddingReply = oneshot::Receiver<Result<Embedding, BackendError>>;
