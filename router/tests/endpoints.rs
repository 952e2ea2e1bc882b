//! Models, probes and metrics.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::sync::Arc;

use http::StatusCode;
use serde_json::json;
use support::{app_for, assert_error, get, post_json};
use switchyard_router::fake::FakeBackend;
use switchyard_router::{AppState, RouterConfig};
use switchyard_seam::ModelCard;

fn card(id: &str, context_length: u32) -> ModelCard {
    ModelCard {
        parent: None,
        id: id.to_owned(),
        created: 1_700_000_123,
        owned_by: "lab".to_owned(),
        context_length,
    }
}

#[tokio::test]
async fn models_are_listed_and_retrievable() {
    let fake = FakeBackend::builder()
        .models(vec![card("small", 2048), card("org/big", 8192)])
        .build();
    let (app, _) = app_for(&fake);
    let reply = get(&app, "/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"object": "list", "data": [
            {"id": "small", "object": "model", "created": 1_700_000_123, "owned_by": "lab", "context_length": 2048},
            {"id": "org/big", "object": "model", "created": 1_700_000_123, "owned_by": "lab", "context_length": 8192}
        ]})
    );
    let reply = get(&app, "/v1/models/org/big").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["id"], "org/big");
    let reply = get(&app, "/v1/models/missing").await;
    assert_error(
        &reply,
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("model"),
        &["missing"],
    );
    assert_eq!(reply.json()["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn health_is_always_ok_and_ready_waits_for_the_backend() {
    let fake = FakeBackend::builder().not_ready().build();
    let (app, _) = app_for(&fake);
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    let reply = get(&app, "/ready").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["status"], "starting");
    fake.set_ready(true);
    let reply = get(&app, "/ready").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["status"], "ready");
}

#[tokio::test]
async fn metrics_expose_the_expected_series() {
    let model = "metrics-model";
    let fake = FakeBackend::builder().models(vec![card(model, 64)]).build();
    let (app, _) = app_for(&fake);
    let chat = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post_json(&app, "/v1/chat/completions", &chat).await.status,
        StatusCode::OK
    );
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    assert_eq!(
        post_json(&app, "/v1/chat/completions", &streamed)
            .await
            .status,
        StatusCode::OK
    );
    let mut too_long = chat.clone();
    too_long["max_tokens"] = json!(500);
    assert_eq!(
        post_json(&app, "/v1/chat/completions", &too_long)
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let mut unknown = chat.clone();
    unknown["model"] = json!("not-a-served-model");
    assert_eq!(
        post_json(&app, "/v1/chat/completions", &unknown)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    switchyard_router::metrics::set_queue_depth(model, 3);

    // A second app in the same process shares the recorder.
    let other = switchyard_router::app(AppState::new(
        Arc::new(FakeBackend::default()),
        RouterConfig::default(),
    ));
    let reply = get(&other, "/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = reply.text;
    let has_line = |parts: &[&str]| {
        text.lines()
            .any(|line| parts.iter().all(|part| line.contains(part)))
    };
    let model_label = format!("model=\"{model}\"");
    assert!(
        has_line(&[
            "switchyard_http_requests_total{",
            "path=\"/v1/chat/completions\"",
            &model_label,
            "status=\"200\"",
            "} 2"
        ]),
        "{text}"
    );
    assert!(
        has_line(&[
            "switchyard_http_requests_total{",
            &model_label,
            "status=\"400\""
        ]),
        "{text}"
    );
    assert!(
        has_line(&[
            "switchyard_http_request_duration_seconds_bucket{",
            &model_label
        ]),
        "{text}"
    );
    assert!(
        has_line(&[
            "switchyard_time_to_first_token_seconds_count{",
            &model_label,
            "} 2"
        ]),
        "{text}"
    );
    assert!(
        has_line(&["switchyard_generated_tokens_total{", &model_label, "} 18"]),
        "{text}"
    );
    assert!(
        has_line(&["switchyard_prompt_tokens_total{", &model_label, "} 4"]),
        "{text}"
    );
    assert!(
        has_line(&["switchyard_engine_queue_depth{", &model_label, "} 3"]),
        "{text}"
    );
    assert!(has_line(&["switchyard_http_requests_in_flight"]), "{text}");
    // Names that are not served never become label values.
    assert!(!text.contains("not-a-served-model"), "{text}");
    assert!(
        has_line(&[
            "switchyard_http_requests_total{",
            "model=\"\"",
            "status=\"404\""
        ]),
        "{text}"
    );
}
