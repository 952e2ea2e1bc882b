//! Deadline for a request's response head, with an OpenAI-shaped 504.
//!
//! Dropping the handler future on timeout drops its generation streams, which
//! cancels the work in the engine. A stream that has started is bounded by
//! its `max_tokens`, not by this deadline.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Middleware: answers 504 if the inner service takes longer than `after`.
pub async fn timeout(State(after): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(after, next.run(request)).await {
        Ok(response) => response,
        Err(_elapsed) => ApiError::Timeout { after }.into_response(),
    }
}
