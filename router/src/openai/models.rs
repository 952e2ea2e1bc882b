//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::error::ApiError;
use crate::state::AppState;
use switchyard_seam::{BackendError, ModelCard};

/// `GET /v1/models` body.
#[derive(Debug, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The models.
    pub data: Vec<ModelObject>,
}

/// One model in OpenAI's shape, plus its context length.
#[derive(Debug, Serialize)]
pub struct ModelObject {
    /// The name to put in `model`.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Owner.
    pub owned_by: String,
    /// Context window in tokens (not in OpenAI's schema; vLLM-style clients use it).
    pub context_length: u32,
}

impl From<ModelCard> for ModelObject {
    fn from(card: ModelCard) -> Self {
        ModelObject {
            id: card.id,
            object: "model",
            created: card.created,
            owned_by: card.owned_by,
            context_length: card.context_length,
        }
    }
}

/// `GET /v1/models`.
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: state
            .backend()
            .models()
            .into_iter()
            .map(Into::into)
            .collect(),
    })
}

/// `GET /v1/models/{id}`; ids may contain `/` (e.g. `org/name`).
pub async fn retrieve_model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state
        .backend()
        .models()
        .into_iter()
        .find(|card| card.id == id)
    {
        Some(card) => Json(ModelObject::from(card)).into_response(),
        None => {
            ApiError::backend(BackendError::UnknownModel { model: id }, "model").into_response()
        }
    }
}
