//! Probes: `GET /health` (the process answers) and `GET /ready` (the backend
//! can take requests).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::json;

use crate::state::AppState;

/// `GET /health`: always 200 while the server runs.
pub async fn health() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /ready`: 200 once the backend is ready, 503 before.
pub async fn ready(State(state): State<AppState>) -> Response {
    if state.backend().ready() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "starting", "message": "the inference backend is not ready yet" })),
        )
            .into_response()
    }
}
