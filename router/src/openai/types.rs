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
//!
//! The fields chat and completions share are written once, in the `shared`
//! list of the `wire_bodies!` call below: the macro declares them in each
//! body and in [`SharedFields`], which `params.rs` validates for both. Not
//! `#[serde(flatten)]`: a flattened struct is read through a buffer that
//! loses the field's name from a type error's path (a 400 must say
//! `temperature`), and the buffer costs every request a second pass.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// Declares [`SharedFields`] from the `shared` list, and each body with its
/// own fields and the shared ones, plus `take_shared`, which moves the
/// shared fields out into a [`SharedFields`] (every one is an `Option`).
macro_rules! wire_bodies {
    (
        shared $shared:tt
        $($(#[$meta:meta])* pub struct $name:ident $own:tt)*
    ) => {
        shared_fields! { $shared }
        $(wire_body! { $shared $(#[$meta])* $name $own })*
    };
}

/// [`SharedFields`] itself, and the names of its fields.
macro_rules! shared_fields {
    ({ $($(#[$doc:meta])* $field:ident: $ty:ty,)* }) => {
        /// The fields every generation endpoint accepts, as they arrived
        /// (taken out of a body by its `take_shared`).
        #[derive(Debug, Default)]
        pub struct SharedFields {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl SharedFields {
            /// Each field's wire name.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
        }
    };
}

/// One body: its own fields, then the shared ones.
macro_rules! wire_body {
    (
        { $($(#[$sdoc:meta])* $sfield:ident: $sty:ty,)* }
        $(#[$meta:meta])* $name:ident { $($(#[$doc:meta])* pub $field:ident: $ty:ty,)* }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize)]
        pub struct $name {
            $($(#[$doc])* pub $field: $ty,)*
            $($(#[$sdoc])* pub $sfield: $sty,)*
        }

        impl $name {
            /// Moves the fields every generation endpoint shares out; its own stay.
            pub fn take_shared(&mut self) -> SharedFields {
                SharedFields {
                    $($sfield: self.$sfield.take(),)*
                }
            }
        }
    };
}

wire_bodies! {
    shared {
        /// Model name.
        model: Option<String>,
        /// Most tokens to generate per choice. Chat: deprecated by OpenAI in favour
        /// of `max_completion_tokens`, still accepted; completions: 16 when absent.
        max_tokens: Option<i64>,
        /// Sampling temperature.
        temperature: Option<f64>,
        /// Nucleus sampling mass.
        top_p: Option<f64>,
        /// Choices (chat) or completions per prompt.
        n: Option<i64>,
        /// A string or an array of strings.
        stop: Option<Value>,
        /// Sampling seed.
        seed: Option<i64>,
        /// Presence penalty.
        presence_penalty: Option<f64>,
        /// Frequency penalty.
        frequency_penalty: Option<f64>,
        /// Token id (as a string) to bias.
        logit_bias: Option<BTreeMap<String, f64>>,
        /// End-user id.
        user: Option<String>,
        /// Stream the answer as SSE.
        stream: Option<bool>,
        /// Streaming options.
        stream_options: Option<StreamOptions>,
        /// `{"type": "text" | "json_object" | "json_schema", ...}`.
        response_format: Option<Value>,
        /// vLLM's prompt-cache salt: only requests with the same salt share cached blocks.
        cache_salt: Option<String>,
    }

    /// `POST /v1/chat/completions` body.
    pub struct ChatCompletionRequest {
        /// The conversation.
        pub messages: Option<Vec<WireMessage>>,
        /// Most tokens to generate; wins over `max_tokens` when both come.
        pub max_completion_tokens: Option<i64>,
        /// Whether to return log-probabilities.
        pub logprobs: Option<bool>,
        /// How many alternatives per token (needs `logprobs: true`).
        pub top_logprobs: Option<i64>,
        /// Functions the model may call (`[{"type": "function", "function": {...}}]`).
        pub tools: Option<Value>,
        /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
        pub tool_choice: Option<Value>,
        /// Whether one answer may hold several calls (default true).
        pub parallel_tool_calls: Option<bool>,
    }

    /// `POST /v1/completions` body.
    pub struct CompletionRequest {
        /// A string, an array of strings, an array of token ids, or an array of
        /// token-id arrays.
        pub prompt: Option<Value>,
        /// Number of alternatives per token to return log-probabilities for.
        pub logprobs: Option<i64>,
        /// Echo the prompt (not supported; refused when true).
        pub echo: Option<bool>,
        /// Server-side best-of sampling (not supported; refused above 1).
        pub best_of: Option<i64>,
        /// Text after the completion (not supported; refused when non-empty).
        pub suffix: Option<String>,
    }
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
