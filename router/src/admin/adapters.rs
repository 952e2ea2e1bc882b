//! LoRA adapters through the admin API: list them against their budget,
//! register one at run time, forget one. The body of a registration is
//! checked field by field here (a 400 naming the field); the adapter itself
//! is checked against its base by the engine (a 422 naming the file and
//! the reason), and serving goes on either way.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use crate::admin::model_admin::AdapterRequest;
use crate::admin::models::{blocking, respond};
use crate::admin::{AdminApiError, AdminState};

/// `GET /admin/adapters`.
pub(crate) async fn list(State(state): State<AdminState>) -> Response {
    match state.models() {
        Ok(models) => match blocking(models, |m| m.adapters()).await {
            Ok(value) => Json(value).into_response(),
            Err(error) => error.into_response(),
        },
        Err(error) => error.into_response(),
    }
}

/// `POST /admin/adapters` with `{"name", "base", "path", "version"?, "activate"?}`.
pub(crate) async fn register(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = match parse(&body) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let models = match state.models() {
        Ok(models) => models,
        Err(error) => return error.into_response(),
    };
    tracing::info!(adapter = %request.name, base = %request.base, path = %request.path, "admin: register adapter");
    respond(blocking(models, move |m| m.register_adapter(request)).await)
}

/// `DELETE /admin/adapters/{name}`.
pub(crate) async fn unregister(
    State(state): State<AdminState>,
    Path(name): Path<String>,
) -> Response {
    let models = match state.models() {
        Ok(models) => models,
        Err(error) => return error.into_response(),
    };
    tracing::info!(adapter = %name, "admin: unregister adapter");
    respond(blocking(models, move |m| m.unregister_adapter(&name)).await)
}

const FIELDS: &str = "name, base, path, version, activate";

fn bad(param: &str, message: impl Into<String>) -> AdminApiError {
    AdminApiError::BadBody {
        param: param.to_owned(),
        message: message.into(),
    }
}

/// The registration in `body`, or a 400 naming the field at fault.
fn parse(body: &[u8]) -> Result<AdapterRequest, AdminApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            "body",
            format!("is not JSON ({e}); send {{\"name\": ..., \"base\": ..., \"path\": ...}}"),
        )
    })?;
    let Value::Object(fields) = value else {
        return Err(bad(
            "body",
            "must be a JSON object with name, base and path",
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.split(", ").any(|f| f == *k)) {
        return Err(bad(
            unknown,
            format!("unknown field; the fields are {FIELDS}"),
        ));
    }
    let text = |field: &str, default: Option<&str>| -> Result<String, AdminApiError> {
        match (fields.get(field), default) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (None | Some(Value::Null), Some(default)) => Ok(default.to_owned()),
            (None | Some(Value::Null), None) => Err(bad(field, "is required (a string)")),
            (Some(other), _) => Err(bad(field, format!("must be a string, not {other}"))),
        }
    };
    Ok(AdapterRequest {
        name: text("name", None)?,
        base: text("base", None)?,
        path: text("path", None)?,
        version: text("version", Some("1"))?,
        activate: flag(&fields, "activate", true)?,
    })
}

fn flag(fields: &Map<String, Value>, field: &str, default: bool) -> Result<bool, AdminApiError> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(field, format!("must be true or false, not {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> String {
        match parse(body.as_bytes()) {
            Err(AdminApiError::BadBody { param, .. }) => param,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(param("not json"), "body");
        assert_eq!(param("[1]"), "body");
        assert_eq!(param(r#"{"base": "b", "path": "/p"}"#), "name");
        assert_eq!(param(r#"{"name": 3, "base": "b", "path": "/p"}"#), "name");
        assert_eq!(param(r#"{"name": "a", "path": "/p"}"#), "base");
        assert_eq!(param(r#"{"name": "a", "base": "b"}"#), "path");
        assert_eq!(
            param(r#"{"name": "a", "base": "b", "path": "/p", "activate": "yes"}"#),
            "activate"
        );
        assert_eq!(
            param(r#"{"name": "a", "base": "b", "path": "/p", "rank": 8}"#),
            "rank"
        );
    }

    #[test]
    fn defaults_fill_version_and_activate() {
        let r = parse(br#"{"name": "a", "base": "b", "path": "/p"}"#).unwrap();
        assert_eq!((r.version.as_str(), r.activate), ("1", true));
        let r = parse(
            br#"{"name": "a", "base": "b", "path": "/p", "version": "2", "activate": false}"#,
        )
        .unwrap();
        assert_eq!((r.version.as_str(), r.activate), ("2", false));
    }
}
