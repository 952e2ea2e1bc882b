//! Model lifecycle through the admin API, delegated to a [`ModelAdmin`] the engine
//! adapter implements.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::admin::model_admin::{AdminError, ModelAdmin};
use crate::admin::{AdminApiError, AdminState};

/// Runs `op` on the blocking pool (model operations may take seconds).
pub(crate) async fn blocking<T: Send + 'static>(
    models: Arc<dyn ModelAdmin>,
    op: impl FnOnce(&dyn ModelAdmin) -> T + Send + 'static,
) -> Result<T, AdminApiError> {
    tokio::task::spawn_blocking(move || op(models.as_ref()))
        .await
        .map_err(|error| AdminApiError::Task(error.to_string()))
}

/// `GET /admin/models`.
pub(crate) async fn list(State(state): State<AdminState>) -> Response {
    match state.models() {
        Ok(models) => match blocking(models, |m| m.models()).await {
            Ok(value) => Json(value).into_response(),
            Err(error) => error.into_response(),
        },
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/status`.
pub(crate) async fn status(State(state): State<AdminState>) -> Response {
    match state.models() {
        Ok(models) => match blocking(models, |m| m.status()).await {
            Ok(value) => Json(value).into_response(),
            Err(error) => error.into_response(),
        },
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/cache`: the prompt cache's use per cache scope (issue 37).
pub(crate) async fn cache(State(state): State<AdminState>) -> Response {
    match state.models() {
        Ok(models) => match blocking(models, |m| m.cache()).await {
            Ok(value) => Json(value).into_response(),
            Err(error) => error.into_response(),
        },
        Err(error) => error.into_response(),
    }
}

/// `POST /admin/models/{model}/versions/{version}/{load|unload|activate}`.
pub(crate) async fn version_action(
    State(state): State<AdminState>,
    Path((model, version, action)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    // `?force=true` overrides a quality gate's refusal of an activation.
    let force = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "force=true" || p == "force=1"));
    let op: fn(&dyn ModelAdmin, &str, &str, bool) -> Result<serde_json::Value, AdminError> =
        match action.as_str() {
            "load" => |m, model, version, _| m.load(model, version),
            "unload" => |m, model, version, _| m.unload(model, version),
            "activate" => |m, model, version, force| m.activate_with(model, version, force),
            _ => {
                return AdminApiError::UnknownEndpoint {
                    method: "POST".to_owned(),
                    path: request.uri().path().to_owned(),
                }
                .into_response()
            }
        };
    let models = match state.models() {
        Ok(models) => models,
        Err(error) => return error.into_response(),
    };
    tracing::info!(%model, %version, %action, "admin: model operation");
    respond(blocking(models, move |m| op(m, &model, &version, force)).await)
}

/// `POST /admin/models/{model}/rollback`.
pub(crate) async fn rollback(
    State(state): State<AdminState>,
    Path(model): Path<String>,
) -> Response {
    let models = match state.models() {
        Ok(models) => models,
        Err(error) => return error.into_response(),
    };
    tracing::info!(%model, "admin: model rollback");
    respond(blocking(models, move |m| m.rollback(&model)).await)
}

pub(crate) fn respond(
    result: Result<Result<serde_json::Value, AdminError>, AdminApiError>,
) -> Response {
    match result {
        Ok(Ok(value)) => Json(value).into_response(),
        Ok(Err(error)) => AdminApiError::Model(error).into_response(),
        Err(error) => error.into_response(),
    }
}
