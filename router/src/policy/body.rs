//! The request body, parsed once.
//!
//! The policy layer needs a few fields of the body to route (`model`, `max_tokens`,
//! `user`, the prompt's size) and the handler needs all of it. The layer parses the
//! body into the endpoint's wire type, routes on it, and leaves it in the request's
//! extensions as a [`ParsedBody`], which the handler's
//! [`OpenAiJson`](crate::openai::extract::OpenAiJson) extractor takes instead of parsing
//! the bytes again.
//!
//! A body the wire type refuses (a field of the wrong JSON type) is read leniently
//! instead ([`crate::policy::request::RawFields`]), routed as before, and left for the
//! handler to parse and refuse with its own precise message, so errors come in the same
//! order (credentials and budgets before field types) as when the body was read twice.

use serde::de::DeserializeOwned;
use switchyard_policies::ModelHint;

use crate::error::ApiError;
use crate::openai::types::{ChatCompletionRequest, CompletionRequest};
use crate::policy::request::{
    chat_tokens, generations, prompt_count, prompt_tokens, RoutingFields,
};

/// A body parsed by the policy layer, waiting for its handler.
#[derive(Debug, Clone)]
pub struct ParsedBody<T>(pub T);

/// A wire type the policy layer can route on: [`ChatCompletionRequest`] and
/// [`CompletionRequest`] (sealed: only this crate can build [`RoutingFields`]).
pub trait RoutableBody: DeserializeOwned + Clone + Send + Sync + 'static {
    /// What routing reads from the body.
    fn routing_fields(&self) -> RoutingFields;
}

impl RoutableBody for ChatCompletionRequest {
    fn routing_fields(&self) -> RoutingFields {
        let tokens = self.messages.as_deref().map_or(0, |messages| {
            chat_tokens(messages.iter().map(|m| m.content.as_ref()))
        });
        fields(
            self.model.as_deref(),
            self.max_completion_tokens.or(self.max_tokens),
            self.user.as_deref(),
            tokens,
            generations(1, self.n),
        )
    }
}

impl RoutableBody for CompletionRequest {
    fn routing_fields(&self) -> RoutingFields {
        fields(
            self.model.as_deref(),
            self.max_tokens,
            self.user.as_deref(),
            self.prompt.as_ref().map_or(0, prompt_tokens),
            generations(self.prompt.as_ref().map_or(1, prompt_count), self.n),
        )
    }
}

/// The fields as the lenient reading gives them: a missing `model` is the handler's
/// error, a negative or oversized `max_tokens` counts as unset, an empty `user` as none.
fn fields(
    model: Option<&str>,
    max_tokens: Option<i64>,
    user: Option<&str>,
    prompt_tokens: u32,
    generations: u32,
) -> RoutingFields {
    RoutingFields {
        model: model
            .map(ModelHint::parse)
            .ok_or_else(|| ApiError::MissingParameter {
                param: "model".to_owned(),
            }),
        max_output_tokens: max_tokens.and_then(|v| u32::try_from(v).ok()),
        user: user.filter(|u| !u.is_empty()).map(str::to_owned),
        prompt_tokens,
        generations,
    }
}
