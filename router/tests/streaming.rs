//! Streams end to end: cancellation on disconnect, errors mid-stream, a real
//! TCP server with a real HTTP client, and graceful shutdown.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use futures_util::StreamExt;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use support::{app_for, assert_error, post_json, sse_data};
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_router::{app, serve_with_drain_deadline, AppState, RouterConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tower::ServiceExt;

const CHAT: &str = "/v1/chat/completions";

fn streamed_chat(n: u32) -> serde_json::Value {
    json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": true, "n": n})
}

#[tokio::test(start_paused = true)]
async fn dropping_the_sse_body_cancels_every_generation() {
    let fake = FakeBackend::builder()
        .token_delay(Duration::from_millis(20))
        .build();
    let (app, _) = app_for(&fake);
    let request = Request::post(CHAT)
        .header("content-type", "application/json")
        .body(Body::from(streamed_chat(3).to_string()))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    assert_eq!(fake.cancelled(), 0);
    drop(body);
    assert!(
        fake.wait_for_cancelled(3, Duration::from_secs(5)).await,
        "cancelled only {} of 3",
        fake.cancelled()
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_whole_json_request_cancels_its_generation() {
    let fake = FakeBackend::builder().held().build();
    let (app, _) = app_for(&fake);
    let pending = tokio::spawn(async move {
        let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]});
        post_json(&app, CHAT, &request).await
    });
    tokio::time::timeout(Duration::from_secs(5), async {
        while fake.submitted().is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap();
    pending.abort();
    assert!(fake.wait_for_cancelled(1, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn an_error_mid_stream_is_sent_as_an_error_event_and_ends_the_stream() {
    let fake = FakeBackend::builder().fail_after(2).build();
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &streamed_chat(1)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let data = reply.sse_data();
    assert_eq!(data.len(), 4, "{data:?}");
    assert!(!data.contains(&"[DONE]".to_owned()));
    let error: serde_json::Value = serde_json::from_str(&data[3]).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(error["error"]["code"], "internal_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("fake failure after 2 tokens"));
}

#[tokio::test]
async fn an_error_in_a_whole_request_is_a_500() {
    let fake = FakeBackend::builder().fail_after(1).build();
    let (app, _) = app_for(&fake);
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let reply = post_json(&app, CHAT, &request).await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        None,
        &["fake failure"],
    );
}

/// Starts a real server; returns its address, the shutdown trigger and the server task.
async fn start(
    fake: &FakeBackend,
    drain_deadline: Duration,
) -> (
    String,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let app = app(AppState::new(
        std::sync::Arc::new(fake.clone()),
        RouterConfig::default(),
    ));
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let server = tokio::spawn(serve_with_drain_deadline(
        listener,
        app,
        shutdown,
        drain_deadline,
    ));
    (address, stop, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_over_tcp_with_a_real_client() {
    let fake = FakeBackend::builder().reply("over the wire").build();
    let (address, stop, server) = start(&fake, Duration::from_secs(5)).await;
    let client = reqwest::Client::new();

    let response = client
        .post(format!("{address}{CHAT}"))
        .header("x-request-id", "tcp-1")
        .json(&json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": true,
                      "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-request-id"], "tcp-1");
    let mut text = String::new();
    let mut bytes = response.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let data = sse_data(&text);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "over the wire");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 3);
    assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-tcp-1"));

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnecting_over_tcp_cancels_the_generation() {
    let fake = FakeBackend::builder()
        .token_delay(Duration::from_millis(50))
        .build();
    let (address, stop, server) = start(&fake, Duration::from_secs(5)).await;
    let response = reqwest::Client::new()
        .post(format!("{address}{CHAT}"))
        .json(&streamed_chat(1))
        .send()
        .await
        .unwrap();
    let mut bytes = response.bytes_stream();
    let first = bytes.next().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first)
        .unwrap()
        .contains("chat.completion.chunk"));
    drop(bytes);
    assert!(fake.wait_for_cancelled(1, Duration::from_secs(5)).await);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_then_gives_up_at_the_deadline() {
    // A held generation keeps its stream open forever.
    let fake = FakeBackend::builder().held().build();
    let deadline = Duration::from_millis(300);
    let (address, stop, server) = start(&fake, deadline).await;
    let response = reqwest::Client::new()
        .post(format!("{address}{CHAT}"))
        .json(&streamed_chat(1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let began = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        began.elapsed() >= deadline,
        "returned after {:?}",
        began.elapsed()
    );
    // New connections are refused once shut down.
    assert!(reqwest::Client::new()
        .get(format!("{address}/health"))
        .send()
        .await
        .is_err());
    drop(response);
}
