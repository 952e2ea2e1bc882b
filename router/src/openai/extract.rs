//! The JSON body extractor: like `axum::Json`, but every failure is an
//! OpenAI-shaped [`ApiError`] naming the field at fault.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::policy::ParsedBody;

/// A request body parsed as JSON into `T`.
///
/// The `Content-Type` is checked before the body is read, by
/// [`crate::layers::json_body`] on the inference routes. A body the policy layer
/// already parsed ([`ParsedBody`]) is taken as is, not parsed again.
#[derive(Debug)]
pub struct OpenAiJson<T>(pub T);

impl<S, T> FromRequest<S> for OpenAiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send + Sync + 'static,
{
    type Rejection = ApiError;

    async fn from_request(mut request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(ParsedBody(parsed)) = request.extensions_mut().remove::<ParsedBody<T>>() {
            return Ok(OpenAiJson(parsed));
        }
        let limit = request
            .extensions()
            .get::<BodyLimit>()
            .map_or(usize::MAX, |limit| limit.0);
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge { limit }
                } else {
                    ApiError::InvalidJson {
                        detail: rejection.body_text(),
                    }
                }
            })?;
        // Well-formed bodies (nearly all) skip the field-path tracking only errors need.
        match try_parse_json_object(&bytes) {
            Some(parsed) => Ok(OpenAiJson(parsed)),
            None => parse_json_object(&bytes).map(OpenAiJson),
        }
    }
}

/// The configured body limit, put in request extensions by [`crate::app`] so
/// that a 413 can state it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Parses `bytes` as `T` when they hold one JSON object that `T` accepts; `None`
/// otherwise, without saying why: the fast path for a caller that falls back to
/// [`parse_json_object`] for the error (tracking the path of every field, which only an
/// error needs, costs about a third of a parse).
pub fn try_parse_json_object<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    // As in `parse_json_object`: serde would read a struct from an array of its fields.
    if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

/// Parses `bytes`, which must hold one JSON object, as `T`, naming the path
/// of a field with the wrong type.
pub fn parse_json_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would happily read a struct from an array of its fields in order;
    // OpenAI bodies are objects, so anything else is refused up front.
    match bytes.iter().find(|byte| !byte.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            return Err(ApiError::InvalidJson {
                detail: "the body is JSON but not an object".to_owned(),
            })
        }
        None => {
            return Err(ApiError::InvalidJson {
                detail: "the body is empty".to_owned(),
            })
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // A wrong type on a named field is the client's most common mistake;
        // say which field. Syntax errors and a non-object body have no field.
        if inner.is_data() && path != "." {
            ApiError::InvalidType {
                param: path,
                detail: inner.to_string(),
            }
        } else {
            ApiError::InvalidJson {
                detail: inner.to_string(),
            }
        }
    })?;
    deserializer.end().map_err(|err| ApiError::InvalidJson {
        detail: err.to_string(),
    })?;
    Ok(value)
}
