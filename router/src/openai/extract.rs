//! Parsing a request body as one JSON object: every failure is an OpenAI-shaped
//! [`ApiError`] naming the field at fault.

use serde::de::DeserializeOwned;

use crate::error::ApiError;

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
