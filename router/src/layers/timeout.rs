//! The request deadline: set once, when the request arrives, and read by everyone who
//! needs it. The layer answers an OpenAI-shaped 504 when the response head is not ready
//! by then, and leaves the [`Deadline`] in the request's extensions, from where the
//! handler carries it to the engine in each `GenerationRequest` (its scheduler runs a
//! checkpoint sooner as its requests' deadlines near).
//!
//! Dropping the handler future on timeout drops its generation streams, which
//! cancels the work in the engine. A stream that has started is bounded by
//! its `max_tokens`, not by this deadline.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use http::request::Parts;
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::Inner;

/// Answers 504 if the service it wraps takes longer than `after`.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    after: Duration,
}

impl TimeoutLayer {
    /// A deadline of `after` for each response head.
    pub fn new(after: Duration) -> Self {
        TimeoutLayer { after }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            after: self.after,
        }
    }
}

/// The service of [`TimeoutLayer`].
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    after: Duration,
}

impl<S: Inner> Service<Request> for Timeout<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let after = self.after;
        // Tokio's clock, so that the 504 and the engine's deadline are the same instant
        // (a test's paused clock included).
        let deadline = tokio::time::Instant::now() + after;
        request
            .extensions_mut()
            .insert(Deadline(Some(deadline.into_std())));
        let response = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout_at(deadline, response).await {
                Ok(response) => response,
                Err(_elapsed) => Ok(ApiError::Timeout { after }.into_response()),
            }
        })
    }
}

/// When the request must be answered by, as [`TimeoutLayer`] set it on arrival; a
/// handler extracts it to hand it on. `None` where no timeout layer runs in front.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deadline(pub Option<Instant>);

impl<S: Send + Sync> FromRequestParts<S> for Deadline {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(parts
            .extensions
            .get::<Deadline>()
            .copied()
            .unwrap_or_default())
    }
}
