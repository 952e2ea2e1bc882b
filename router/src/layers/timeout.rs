//! Deadline for a request's response head, with an OpenAI-shaped 504.
//!
//! Dropping the handler future on timeout drops its generation streams, which
//! cancels the work in the engine. A stream that has started is bounded by
//! its `max_tokens`, not by this deadline.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
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

    fn call(&mut self, request: Request) -> Self::Future {
        let after = self.after;
        let response = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(after, response).await {
                Ok(response) => response,
                Err(_elapsed) => Ok(ApiError::Timeout { after }.into_response()),
            }
        })
    }
}
