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
    /// For a `name@version` entry (one version of a model, Switchyard's
    /// spelling), the model it is a version of; absent for a model itself.
    /// vLLM lists each LoRA adapter with its base model as `parent`, which is
    /// how inference gateways and their tools tell the two kinds apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl From<ModelCard> for ModelObject {
    fn from(card: ModelCard) -> Self {
        let parent = card
            .parent
            .clone()
            .or_else(|| card.id.rsplit_once('@').map(|(name, _)| name.to_owned()));
        ModelObject {
            parent,
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
