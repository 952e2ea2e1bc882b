//! Request ids: `x-request-id` is taken from the client or generated, set on
//! the request for handlers and logs, and echoed on the response.
//!
//! A client's id is kept only when it is short and plain (at most
//! [`MAX_REQUEST_ID_LEN`] characters of `A-Z a-z 0-9 - _ . :`); any other is
//! replaced by a fresh UUID, so that a 60 KB or control-laden header is never
//! echoed into response headers, completion ids and logs.

use std::task::{Context, Poll};

use axum::extract::Request;
use http::{HeaderMap, HeaderName};
use tower::{Layer, Service};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

/// The header carrying the request id.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client-chosen request id kept.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Sets `x-request-id` on requests that lack one (a random UUID).
pub fn set_request_id_layer() -> SetRequestIdLayer<MakeRequestUuid> {
    SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid)
}

/// Copies the request's `x-request-id` onto the response.
pub fn propagate_request_id_layer() -> PropagateRequestIdLayer {
    PropagateRequestIdLayer::new(REQUEST_ID_HEADER)
}

/// Whether a client's request id is kept as it is.
pub fn is_plain_request_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID_LEN
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Drops an `x-request-id` that is not plain (see the module documentation), so that
/// [`set_request_id_layer`] generates one; goes outside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SanitizeRequestIdLayer;

impl<S> Layer<S> for SanitizeRequestIdLayer {
    type Service = SanitizeRequestId<S>;

    fn layer(&self, inner: S) -> SanitizeRequestId<S> {
        SanitizeRequestId { inner }
    }
}

/// The service of [`SanitizeRequestIdLayer`].
#[derive(Debug, Clone)]
pub struct SanitizeRequestId<S> {
    inner: S,
}

// Generic in the response: it wraps the whole stack, trace layer included, whose
// responses carry its own body type.
impl<S: Service<Request>> Service<Request> for SanitizeRequestId<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let headers = request.headers();
        let plain = {
            let mut ids = headers.get_all(&REQUEST_ID_HEADER).iter();
            match (ids.next(), ids.next()) {
                (None, _) => true,
                (Some(id), None) => is_plain_request_id(id.as_bytes()),
                // Two ids: neither is trusted.
                (Some(_), Some(_)) => false,
            }
        };
        if !plain {
            request.headers_mut().remove(&REQUEST_ID_HEADER);
        }
        self.inner.call(request)
    }
}

/// The request id of a request that went through [`set_request_id_layer`].
///
/// A header that is not plain cannot reach here (see [`SanitizeRequestIdLayer`]);
/// without one (a handler called directly), a fresh UUID.
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID_HEADER)
        .map(|value| value.as_bytes())
        .filter(|id| is_plain_request_id(id))
        .and_then(|id| std::str::from_utf8(id).ok())
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}
