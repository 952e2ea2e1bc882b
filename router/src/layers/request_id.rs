//! Request ids: `x-request-id` is taken from the client or generated, set on
//! the request for handlers and logs, and echoed on the response.

use http::{HeaderMap, HeaderName};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

/// The header carrying the request id.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Sets `x-request-id` on requests that lack one (a random UUID).
pub fn set_request_id_layer() -> SetRequestIdLayer<MakeRequestUuid> {
    SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid)
}

/// Copies the request's `x-request-id` onto the response.
pub fn propagate_request_id_layer() -> PropagateRequestIdLayer {
    PropagateRequestIdLayer::new(REQUEST_ID_HEADER)
}

/// The request id of a request that went through [`set_request_id_layer`].
///
/// A header that is not visible ASCII cannot be echoed into JSON ids, so it is
/// replaced by a fresh UUID (the response header still echoes the original).
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}
