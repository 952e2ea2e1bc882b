//! Helpers shared by the router's integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use switchyard_router::fake::FakeBackend;
use switchyard_router::{app, AppState, RouterConfig};
use tower::ServiceExt;

/// An app over `fake` with default limits, and its state.
pub fn app_for(fake: &FakeBackend) -> (Router, AppState) {
    app_with(fake, RouterConfig::default())
}

/// An app over `fake` with `config`, and its state.
pub fn app_with(fake: &FakeBackend, config: RouterConfig) -> (Router, AppState) {
    let state = AppState::new(Arc::new(fake.clone()), config);
    (app(state.clone()), state)
}

/// A response, read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|err| panic!("body is not JSON ({err}): {}", self.text))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text)
    }

    /// The `data:` payloads of an SSE body, `[DONE]` excluded, as JSON.
    pub fn sse_json(&self) -> Vec<Value> {
        self.sse_data()
            .into_iter()
            .filter(|data| data != "[DONE]")
            .map(|data| serde_json::from_str(&data).unwrap())
            .collect()
    }
}

/// The `data:` payloads of an SSE text.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .filter_map(|event| {
            event
                .lines()
                .find_map(|line| {
                    line.strip_prefix("data: ")
                        .or_else(|| line.strip_prefix("data:"))
                })
                .map(str::to_owned)
        })
        .collect()
}

/// Sends `request` through `app` and reads the whole response.
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// `POST path` with a JSON body.
pub async fn post_json(app: &Router, path: &str, body: &Value) -> Reply {
    post_raw(app, path, body.to_string()).await
}

/// `POST path` with a raw body.
pub async fn post_raw(app: &Router, path: &str, body: impl Into<Body>) -> Reply {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    send(app, request).await
}

/// `GET path`.
pub async fn get(app: &Router, path: &str) -> Reply {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

/// Asserts an OpenAI-shaped error with this status, type and param whose
/// message contains every one of `mentions`.
pub fn assert_error(
    reply: &Reply,
    status: StatusCode,
    kind: &str,
    param: Option<&str>,
    mentions: &[&str],
) {
    assert_eq!(reply.status, status, "body: {}", reply.text);
    let body = reply.json();
    let error = &body["error"];
    assert_eq!(error["type"], kind, "body: {body}");
    match param {
        Some(param) => assert_eq!(error["param"], param, "body: {body}"),
        None => assert!(error["param"].is_null(), "body: {body}"),
    }
    let message = error["message"].as_str().unwrap();
    for mention in mentions {
        assert!(
            message.contains(mention),
            "message {message:?} should mention {mention:?}"
        );
    }
    assert!(error.get("code").is_some(), "body: {body}");
}
