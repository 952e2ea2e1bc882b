//! Request body size limit with an OpenAI-shaped 413.
//!
//! A declared `Content-Length` over the limit is refused here before the body
//! is read. Chunked bodies are capped by axum's `DefaultBodyLimit` (installed
//! next to this layer in [`crate::app`]) and the JSON extractor turns the
//! overflow into the same 413.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::{ready, Either, Ready};
use http::header::CONTENT_LENGTH;
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::Inner;

/// Refuses requests whose `Content-Length` exceeds `limit` bytes.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimitLayer {
    limit: usize,
}

impl BodyLimitLayer {
    /// Bodies of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        BodyLimitLayer { limit }
    }
}

impl<S> Layer<S> for BodyLimitLayer {
    type Service = LimitBody<S>;

    fn layer(&self, inner: S) -> LimitBody<S> {
        LimitBody {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`BodyLimitLayer`].
#[derive(Debug, Clone)]
pub struct LimitBody<S> {
    inner: S,
    limit: usize,
}

impl<S: Inner> Service<Request> for LimitBody<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        match declared {
            Some(length) if length > self.limit as u64 => Either::Left(ready(Ok(
                ApiError::PayloadTooLarge { limit: self.limit }.into_response(),
            ))),
            _ => Either::Right(self.inner.call(request)),
        }
    }
}

/// The configured body limit, put in request extensions by [`crate::app`] so
/// that a 413 can state it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);
