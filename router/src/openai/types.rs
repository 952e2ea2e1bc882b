//! Request bodies as they arrive on the wire.
//!
//! Fields are deliberately loose (`Option`, signed integers, raw JSON values
//! for the fields OpenAI lets take several shapes) so that deserializing
//! fails only on a wrong JSON type; ranges, shapes and presence are checked
//! when these become [`super::chat::ValidatedChatRequest`] and
//! [`super::completions::ValidatedCompletionRequest`], with messages that
//! name the field and the value. Unknown fields are ignored, as OpenAI
//! clients send many optional ones. (`Clone` only so that the policy layer can hand a
//! parsed body over in request extensions, which require it; nothing clones one.)

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Model name.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Option<Vec<WireMessage>>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; still accepted.
    pub max_tokens: Option<i64>,
    /// Most tokens to generate.
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    pub top_p: Option<f64>,
    /// Number of choices.
    pub n: Option<i64>,
    /// A string or an array of strings.
    pub stop: Option<Value>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) to bias.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Whether to return log-probabilities.
    pub logprobs: Option<bool>,
    /// How many alternatives per token (needs `logprobs: true`).
    pub top_logprobs: Option<i64>,
    /// End-user id.
    pub user: Option<String>,
    /// Stream the answer as SSE.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Functions the model may call (`[{"type": "function", "function": {...}}]`).
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<Value>,
    /// vLLM's prompt-cache salt: only requests with the same salt share cached blocks.
    pub cache_salt: Option<String>,
}

/// One chat message on the wire.
#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: Option<String>,
    /// A string or an array of `{"type": "text", "text": ...}` parts.
    pub content: Option<Value>,
    /// An assistant turn's calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    pub tool_calls: Option<Value>,
    /// A `tool` turn's answer to this call id.
    pub tool_call_id: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with token usage.
    pub include_usage: Option<bool>,
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Model name.
    pub model: Option<String>,
    /// A string, an array of strings, an array of token ids, or an array of
    /// token-id arrays.
    pub prompt: Option<Value>,
    /// Most tokens to generate (OpenAI's default for completions: 16).
    pub max_tokens: Option<i64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    pub top_p: Option<f64>,
    /// Completions per prompt.
    pub n: Option<i64>,
    /// A string or an array of strings.
    pub stop: Option<Value>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) to bias.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Number of alternatives per token to return log-probabilities for.
    pub logprobs: Option<i64>,
    /// Echo the prompt (not supported; refused when true).
    pub echo: Option<bool>,
    /// Server-side best-of sampling (not supported; refused above 1).
    pub best_of: Option<i64>,
    /// Text after the completion (not supported; refused when non-empty).
    pub suffix: Option<String>,
    /// End-user id.
    pub user: Option<String>,
    /// Stream the answer as SSE.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`, as for chat.
    pub response_format: Option<Value>,
    /// vLLM's prompt-cache salt, as for chat.
    pub cache_salt: Option<String>,
}
