//! Whole (non-streamed) completion responses as JSON.
//!
//! `axum::Json` starts a response with an empty header map and a 128-byte body buffer.
//! On its way out the middleware stack adds up to seven headers (content type and
//! length, request id, the policy's four), one more than the map's first allocation
//! holds, so every response's map was reallocated and rehashed; the body buffer grew two
//! or three times. Here both start at a size that fits.

use axum::body::Body;
use axum::response::Response;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use serde::Serialize;

use crate::error::ApiError;
use switchyard_seam::BackendError;

/// Headers a response has room for before its map grows.
const HEADER_ROOM: usize = 12;
/// Body bytes reserved up front: a short completion's JSON fits.
const BODY_ROOM: usize = 1024;

/// `body` as an `application/json` response.
pub fn json_response<T: Serialize>(
    body: &T,
    prompt_field: &'static str,
) -> Result<Response, ApiError> {
    let mut bytes = Vec::with_capacity(BODY_ROOM);
    serde_json::to_writer(&mut bytes, body).map_err(|error| {
        ApiError::backend(
            BackendError::Internal {
                message: format!("the response could not be written as JSON: {error}"),
            },
            prompt_field,
        )
    })?;
    let mut headers = HeaderMap::with_capacity(HEADER_ROOM);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut response = Response::new(Body::from(bytes));
    *response.headers_mut() = headers;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn writes_the_body_as_json_with_room_for_the_stack_headers() {
        let response = json_response(&serde_json::json!({"a": [1, 2], "b": "c"}), "prompt")
            .expect("a JSON value serializes");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert!(response.headers().capacity() >= HEADER_ROOM);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let back: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(back, serde_json::json!({"a": [1, 2], "b": "c"}));
    }
}
