//! Reading an inference request's body whole before it is admitted: a JSON
//! content type, at most the size limit, within a time limit.
//!
//! Admission slots are few and held until the response ends. A request that
//! took its slot before its body arrived let a few hundred sockets sending
//! headers and one byte of body lock every client out; here the body is in
//! memory before the request queues for a slot, and a body that trickles in
//! is cut off with a 408. A body declared as anything but JSON (a browser's
//! `text/plain` form post, say) is refused with 415 before it is read, and so
//! is one without a `Content-Type`: a browser's `no-cors` fetch of a blob
//! sends none, and every OpenAI client library sends `application/json`.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use http::header::CONTENT_TYPE;
use http::HeaderMap;
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::Inner;

/// Reads bodies of at most `limit` bytes within `timeout`, JSON only.
#[derive(Debug, Clone, Copy)]
pub struct JsonBodyLayer {
    limit: usize,
    timeout: Duration,
}

impl JsonBodyLayer {
    /// Bodies of at most `limit` bytes, arriving within `timeout`.
    pub fn new(limit: usize, timeout: Duration) -> Self {
        JsonBodyLayer { limit, timeout }
    }
}

impl<S> Layer<S> for JsonBodyLayer {
    type Service = JsonBody<S>;

    fn layer(&self, inner: S) -> JsonBody<S> {
        JsonBody {
            inner,
            limit: self.limit,
            timeout: self.timeout,
        }
    }
}

/// The service of [`JsonBodyLayer`].
#[derive(Debug, Clone)]
pub struct JsonBody<S> {
    inner: S,
    limit: usize,
    timeout: Duration,
}

impl<S: Inner> Service<Request> for JsonBody<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (limit, timeout) = (self.limit, self.timeout);
        // The inner service is called once the body is in: take the instance made
        // ready and leave a clone (tower's rule for services called later).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(async move {
            if let Err(error) = check_content_type(request.headers()) {
                return Ok(error.into_response());
            }
            let (parts, body) = request.into_parts();
            let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await
            {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(error)) => return Ok(read_error(error, limit).into_response()),
                Err(_elapsed) => {
                    return Ok(ApiError::BodyTimeout { after: timeout }.into_response())
                }
            };
            inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await
        })
    }
}

/// `application/json` or `application/<something>+json`.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Err(ApiError::MissingContentType);
    };
    let text = value.to_str().unwrap_or("");
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if json {
        return Ok(());
    }
    let shown: String = text.chars().filter(|c| !c.is_control()).take(60).collect();
    Err(ApiError::UnsupportedMediaType {
        content_type: shown,
    })
}

/// A body that could not be read: too large, or the connection failed. The one
/// mapping for every place that reads a request body whole.
pub(crate) fn read_error(error: axum::Error, limit: usize) -> ApiError {
    let inner = error.into_inner();
    let too_large = inner
        .downcast_ref::<http_body_util::LengthLimitError>()
        .is_some()
        || std::error::Error::source(inner.as_ref())
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
    if too_large {
        ApiError::PayloadTooLarge { limit }
    } else {
        ApiError::InvalidJson {
            detail: format!("the body could not be read: {inner}"),
        }
    }
}
