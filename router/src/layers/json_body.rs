//! Reading an inference request's body whole before it is admitted: a JSON
//! content type, at most the size limit, within a time limit. The one home of
//! the body limit (tower-http's `RequestBodyLimit` semantics): a declared
//! `Content-Length` past it is refused with an OpenAI-shaped 413 before a byte
//! is read, and a body that streams past it gets the same 413 when it does. The
//! body is read once, here: the bytes travel on in the request's extensions
//! ([`JsonBytes`]) for the policy layer to parse.
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
use axum::body::Bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
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
            if let Err(error) = check_length(request.headers(), limit)
                .and_then(|()| check_content_type(request.headers()))
            {
                return Ok(error.into_response());
            }
            let (mut parts, body) = request.into_parts();
            let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await
            {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(error)) => return Ok(read_error(error, limit).into_response()),
                Err(_elapsed) => {
                    return Ok(ApiError::BodyTimeout { after: timeout }.into_response())
                }
            };
            parts.extensions.insert(JsonBytes(bytes));
            inner.call(Request::from_parts(parts, Body::empty())).await
        })
    }
}

/// The body [`JsonBodyLayer`] read, for the layer that parses it.
#[derive(Debug, Clone)]
pub struct JsonBytes(pub Bytes);

/// Refuses a declared `Content-Length` past `limit` before the body is read.
fn check_length(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => Err(ApiError::PayloadTooLarge { limit }),
        _ => Ok(()),
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

/// A body that could not be read: too large, or the connection failed.
fn read_error(error: axum::Error, limit: usize) -> ApiError {
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use tower::{service_fn, ServiceExt};

    /// The handler behind the layer: answers with the bytes the layer read, and 500
    /// when the body was left to read a second time.
    async fn echo(request: Request) -> Result<Response, Infallible> {
        let (parts, body) = request.into_parts();
        let rest = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Ok(match parts.extensions.get::<JsonBytes>() {
            Some(JsonBytes(bytes)) if rest.is_empty() => Response::new(Body::from(bytes.clone())),
            _ => http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        })
    }

    fn post(body: &'static str, length: Option<usize>) -> Request {
        let mut request = Request::post("/").header(CONTENT_TYPE, "application/json");
        if let Some(length) = length {
            request = request.header(CONTENT_LENGTH, length);
        }
        request.body(Body::from(body)).unwrap()
    }

    #[tokio::test]
    async fn reads_once_and_holds_the_one_limit() {
        let layer = JsonBodyLayer::new(8, Duration::from_secs(5));
        let service = || layer.layer(service_fn(echo));
        let ok = service().oneshot(post("{}", Some(2))).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let body = ok.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{}");
        // Declared past the limit: refused before reading; streamed past it: when it is.
        for length in [Some(9), None] {
            let refused = service()
                .oneshot(post("{\"a\": 12345}", length))
                .await
                .unwrap();
            assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
            let body = refused.into_body().collect().await.unwrap().to_bytes();
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("8 bytes"), "{text}");
        }
    }
}
