//! Probes: `GET /health` (the process answers and its engine runs) and
//! `GET /ready` (the backend can take requests).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::json;

use crate::state::AppState;

/// `GET /health`: 200 while the server runs, 503 once the backend cannot serve at
/// all (its executor died): a restart is the only remedy.
pub async fn health(State(state): State<AppState>) -> Response {
    if state.backend().healthy() {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "unhealthy",
                "message": "the inference engine has stopped; restart the server"
            })),
        )
            .into_response()
    }
}

/// `GET /ready`: 200 once the backend is ready, 503 before; a server started
/// with `--allow-partial-start` lists what it started without.
pub async fn ready(State(state): State<AppState>) -> Response {
    let missing = &state.config().missing_at_startup;
    if state.backend().ready() && !missing.is_empty() {
        Json(json!({ "status": "ready", "missing": missing })).into_response()
    } else if state.backend().ready() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "starting", "message": "the inference backend is not ready yet" })),
        )
            .into_response()
    }
}
