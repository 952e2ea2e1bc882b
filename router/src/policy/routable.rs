//! What the policy layer asks of an inference request type: parse and validate yourself
//! from the body, then say what routing reads.
//!
//! The layer parses the body into the endpoint's validated request first, so a malformed
//! request is refused (an OpenAI-shaped 400 naming the field) before any routing, budget
//! reservation or route counter sees it. The one validated value is then read by routing
//! ([`RoutableRequest::routing_fields`]) and left in the request's extensions as
//! [`Validated`] for the handler. The request types implement this trait where they are
//! defined (`openai/parse.rs`), so this module names no wire type and the arrow points
//! from `openai` to `policy` only.

use axum::extract::FromRequestParts;
use http::request::Parts;
use switchyard_policies::ModelHint;

use crate::error::ApiError;
use crate::policy::error::PolicyRejection;

/// Limits a request is validated against that are the server's, not the wire format's.
#[derive(Debug, Clone, Copy)]
pub struct ParseLimits {
    /// Most generations (prompts × `n`) one request may fan out into.
    pub max_fanout: u32,
}

/// An inference request type the policy layer can parse and route.
pub trait RoutableRequest: Clone + Send + Sync + 'static {
    /// Parses and validates `body`; the error names the field at fault.
    fn parse(body: &[u8], limits: ParseLimits) -> Result<Self, ApiError>;

    /// What routing reads from the validated request.
    fn routing_fields(&self) -> RoutingFields;
}

/// What routing reads from a validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingFields {
    /// The `model` hint.
    pub model: ModelHint,
    /// Most tokens per generation, when the request bounds them.
    pub max_output_tokens: Option<u32>,
    /// A non-empty `user`.
    pub user: Option<String>,
    /// The estimated size of the largest prompt, in tokens.
    pub prompt_tokens: u32,
    /// Generations the request fans out into (prompts × `n`), for the budget
    /// reservation.
    pub generations: u32,
}

/// A request the policy layer validated, waiting in the request's extensions for its
/// handler.
#[derive(Debug, Clone)]
pub struct Validated<T>(pub T);

/// Takes the validated request out of the extensions; fails closed (500) when the app
/// was assembled without [`crate::policy::PolicyLayer`], as [`crate::policy::RoutedRequest`]
/// does.
impl<S: Send + Sync, T: Clone + Send + Sync + 'static> FromRequestParts<S> for Validated<T> {
    type Rejection = PolicyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .remove::<Validated<T>>()
            .ok_or(PolicyRejection::NotRouted)
    }
}
