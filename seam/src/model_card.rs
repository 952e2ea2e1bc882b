//! One served model as `GET /v1/models` lists it.

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
    /// The base model of a LoRA adapter served as a model (vLLM's
    /// `parent`); `None` for a checkpoint.
    pub parent: Option<String>,
}
