//! Request body size limit with an OpenAI-shaped 413.
//!
//! A declared `Content-Length` over the limit is refused here before the body
//! is read. Chunked bodies are capped by axum's `DefaultBodyLimit` (installed
//! next to this layer in [`crate::app`]) and the JSON extractor turns the
//! overflow into the same 413.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_LENGTH;

use crate::error::ApiError;

/// Middleware: refuses requests whose `Content-Length` exceeds `limit` bytes.
pub async fn limit_body(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => {
            ApiError::PayloadTooLarge { limit }.into_response()
        }
        _ => next.run(request).await,
    }
}
