//! The tower stack: request ids, body limit, load shedding, timeout, fallback.
//!
//! Tests that wait or time out run on tokio's paused clock: time moves only when
//! every task is idle, so a 50 ms timeout is exact and a loaded machine cannot
//! make them flaky.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::json;
use support::{app_for, app_with, assert_error, get, post_json, post_raw, send};
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_router::RouterConfig;

const CHAT: &str = "/v1/chat/completions";

fn hello() -> serde_json::Value {
    json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]})
}

async fn until(mut condition: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("condition not reached within 5 s");
}

#[tokio::test]
async fn request_id_is_echoed_and_used() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let request = Request::post(CHAT)
        .header("x-request-id", "abc-123")
        .header("content-type", "application/json")
        .body(Body::from(hello().to_string()))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.headers["x-request-id"], "abc-123");
    assert_eq!(reply.json()["id"], "chatcmpl-abc-123");
    assert_eq!(fake.submitted()[0].request_id, "abc-123");
}

#[tokio::test]
async fn request_id_is_generated_when_absent() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &hello()).await;
    let id = reply.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(reply.json()["id"], format!("chatcmpl-{id}"));
    // Every response gets one, errors and probes included.
    assert!(get(&app, "/health")
        .await
        .headers
        .contains_key("x-request-id"));
    assert!(get(&app, "/nowhere")
        .await
        .headers
        .contains_key("x-request-id"));
}

#[tokio::test]
async fn body_too_large_is_413_in_openai_shape() {
    let fake = FakeBackend::default();
    let config = RouterConfig {
        max_body_bytes: 256,
        ..RouterConfig::default()
    };
    let (app, _) = app_with(&fake, config);
    let big =
        json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x".repeat(1000)}]})
            .to_string();
    // Without Content-Length: caught while reading the body.
    let reply = post_raw(&app, CHAT, big.clone()).await;
    assert_error(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        None,
        &["256 bytes"],
    );
    // With Content-Length: refused before reading.
    let request = Request::post(CHAT)
        .header("content-length", big.len())
        .body(Body::from(big))
        .unwrap();
    let reply = send(&app, request).await;
    assert_error(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        None,
        &["256 bytes"],
    );
    assert!(fake.submitted().is_empty());
}

#[tokio::test(start_paused = true)]
async fn load_shedding_returns_429_with_retry_after_when_full() {
    let fake = FakeBackend::builder().held().build();
    let config = RouterConfig {
        max_in_flight: 1,
        max_queued: 1,
        retry_after: Duration::from_millis(2500),
        ..RouterConfig::default()
    };
    let (app, state) = app_with(&fake, config);
    let first = tokio::spawn({
        let app = app.clone();
        async move { post_json(&app, CHAT, &hello()).await }
    });
    until(|| state.admission().in_flight() == 1).await;
    let second = tokio::spawn({
        let app = app.clone();
        async move { post_json(&app, CHAT, &hello()).await }
    });
    until(|| state.admission().queued() == 1).await;

    let third = post_json(&app, CHAT, &hello()).await;
    assert_error(
        &third,
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        None,
        &["1 requests in flight", "1 waiting"],
    );
    // Whole seconds, rounded up.
    assert_eq!(third.headers["retry-after"], "3");
    // Probes are not behind admission control.
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/v1/models").await.status, StatusCode::OK);

    fake.release();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
    assert_eq!(state.admission().in_flight(), 0);
    assert_eq!(state.admission().queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_giving_up_leaves_the_queue() {
    let fake = FakeBackend::builder().held().build();
    let config = RouterConfig {
        max_in_flight: 1,
        max_queued: 1,
        ..RouterConfig::default()
    };
    let (app, state) = app_with(&fake, config);
    let first = tokio::spawn({
        let app = app.clone();
        async move { post_json(&app, CHAT, &hello()).await }
    });
    until(|| state.admission().in_flight() == 1).await;
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { post_json(&app, CHAT, &hello()).await }
    });
    until(|| state.admission().queued() == 1).await;
    waiting.abort();
    until(|| state.admission().queued() == 0).await;
    fake.release();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn slow_requests_time_out_with_504_and_are_cancelled() {
    let fake = FakeBackend::builder().held().build();
    let config = RouterConfig {
        request_timeout: Duration::from_millis(50),
        ..RouterConfig::default()
    };
    let (app, _) = app_with(&fake, config);
    let reply = post_json(&app, CHAT, &hello()).await;
    assert_error(
        &reply,
        StatusCode::GATEWAY_TIMEOUT,
        "server_error",
        None,
        &["0.05 s"],
    );
    assert!(fake.wait_for_cancelled(1, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn every_generation_carries_the_request_deadline_set_on_arrival() {
    let fake = FakeBackend::default();
    let timeout = Duration::from_secs(30);
    let config = RouterConfig {
        request_timeout: timeout,
        ..RouterConfig::default()
    };
    let (app, _) = app_with(&fake, config);
    let before = Instant::now();
    let mut chat = hello();
    chat["n"] = json!(2);
    chat["stream"] = json!(true);
    assert_eq!(post_json(&app, CHAT, &chat).await.status, StatusCode::OK);
    let completion = json!({"model": FAKE_MODEL, "prompt": ["a", "b"]});
    let reply = post_json(&app, "/v1/completions", &completion).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let after = Instant::now();
    let submitted = fake.submitted();
    assert_eq!(submitted.len(), 4);
    // One deadline per HTTP request, shared by the generations it fans out into.
    assert_eq!(submitted[0].deadline, submitted[1].deadline);
    assert_eq!(submitted[2].deadline, submitted[3].deadline);
    for request in &submitted {
        let deadline = request.deadline.unwrap();
        assert!(
            before + timeout <= deadline && deadline <= after + timeout,
            "{:?} is not {timeout:?} after the request arrived",
            deadline - before
        );
    }
}

#[tokio::test]
async fn unknown_routes_are_404_in_openai_shape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = get(&app, "/v1/engines").await;
    assert_error(
        &reply,
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        &["GET /v1/engines"],
    );
    assert_eq!(reply.json()["error"]["code"], "unknown_url");
}
