#![allow(dead_code)] // each test binary uses a different subset
//! Helpers for the policy-layer tests: fake checkpoints named `model@version`, an app
//! routed by a policy, and a backend wrapper that refuses chosen checkpoints.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::Router;
use http::Request;
use serde_json::{json, Value};
use switchyard_policies::{Policy, PolicyStore};
use switchyard_router::fake::FakeBackend;
use switchyard_router::policy::PolicyRouting;
use switchyard_router::{app_with_policy, AppState, RouterConfig};
use switchyard_seam::{
    BackendError, GenerationRequest, GenerationStream, InferenceBackend, ModelCard,
};

use crate::support::{send, Reply};

/// A fake serving checkpoints `id` with context `context` each.
pub fn fake_serving(checkpoints: &[(&str, u32)]) -> FakeBackend {
    FakeBackend::builder()
        .models(
            checkpoints
                .iter()
                .map(|(id, context)| ModelCard {
                    parent: None,
                    id: (*id).to_owned(),
                    created: 1_700_000_000,
                    owned_by: "test".to_owned(),
                    context_length: *context,
                })
                .collect(),
        )
        .build()
}

/// Delegates to a fake but refuses the named checkpoints with `Overloaded`.
pub struct Refusing {
    pub inner: FakeBackend,
    pub overloaded: Mutex<HashSet<String>>,
}

impl Refusing {
    pub fn new(inner: FakeBackend, overloaded: &[&str]) -> Arc<Self> {
        Arc::new(Refusing {
            inner,
            overloaded: Mutex::new(overloaded.iter().map(|s| (*s).to_owned()).collect()),
        })
    }
}

impl InferenceBackend for Refusing {
    fn models(&self) -> Vec<ModelCard> {
        self.inner.models()
    }
    fn ready(&self) -> bool {
        true
    }
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, BackendError> {
        if self
            .overloaded
            .lock()
            .unwrap()
            .contains(&request.model.to_string())
        {
            return Err(BackendError::Overloaded);
        }
        self.inner.submit(request)
    }
}

/// An app over `backend` routed by the policy in `toml`, and the store.
pub fn policy_app(backend: Arc<dyn InferenceBackend>, toml: &str) -> (Router, Arc<PolicyStore>) {
    let store = Arc::new(PolicyStore::new(Policy::from_toml_str(toml).unwrap()));
    let routing = Arc::new(PolicyRouting::over_backend(
        Arc::clone(&store),
        Arc::clone(&backend),
    ));
    let state = AppState::new(backend, RouterConfig::default());
    (app_with_policy(state, Some(routing)), store)
}

/// `POST /v1/chat/completions` saying `text`, with extra headers.
pub async fn chat(app: &Router, model: &str, text: &str, headers: &[(&str, &str)]) -> Reply {
    chat_body(
        app,
        json!({"model": model, "max_tokens": 5,
        "messages": [{"role": "user", "content": text}]}),
        headers,
    )
    .await
}

/// `POST /v1/chat/completions` with `body` and extra headers.
pub async fn chat_body(app: &Router, body: Value, headers: &[(&str, &str)]) -> Reply {
    let mut request =
        Request::post("/v1/chat/completions").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(app, request.body(Body::from(body.to_string())).unwrap()).await
}

/// A response header as text.
pub fn header<'a>(reply: &'a Reply, name: &str) -> &'a str {
    reply
        .headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header; headers: {:?}", reply.headers))
        .to_str()
        .unwrap()
}
