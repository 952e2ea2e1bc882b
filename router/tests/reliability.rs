//! The attacks of issue 17 that the router alone answers, each as a test that failed
//! before its fix: work bounded before it is allocated, bodies read before admission,
//! client-chosen ids bounded, content types checked.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use axum::body::Body;
use futures_util::StreamExt;
use http::{Request, StatusCode};
use serde_json::json;
use support::*;
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_router::RouterConfig;

const CHAT: &str = "/v1/chat/completions";

/// CPU time this process has used (all its threads), from `/proc/self/stat`: what a
/// piece of work costs, which a busy host's scheduling does not stretch as it does
/// wall time.
fn process_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command's closing parenthesis; utime and stime are the
    // 12th and 13th of them, in clock ticks (USER_HZ, 100 a second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Case 1: a million empty prompts with `n: 16` is refused before prompts × n
/// generation requests are built (it took 14 s and 5 GB before).
#[tokio::test]
async fn a_million_prompts_times_n_is_refused_before_anything_is_built() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let prompts = vec![json!(""); 1_000_000];
    let body = json!({"model": "fake-model", "prompt": prompts, "n": 16});
    // CPU time, not wall time: beside other work, parsing alone took over 2 s of wall
    // time (6 of 30 runs beside 12 busy loops). The process's, so that work moved to
    // another thread counts too; this binary's other tests add well under 0.2 s.
    let started = process_cpu_time();
    let reply = post_json(&app, "/v1/completions", &body).await;
    let elapsed = process_cpu_time() - started;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("n"),
        &["16000000 generations", "at most 64"],
    );
    assert!(fake.submitted().is_empty());
    // Parsing the 4 MB body is most of it; building 16 M requests took seconds.
    assert!(
        elapsed < Duration::from_secs(2),
        "refusing took {elapsed:?} of CPU"
    );
}

fn hello() -> serde_json::Value {
    json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

/// A body that sends `first` and then nothing, ever (a slow-upload attacker).
fn trickle(first: &'static str) -> Body {
    let chunks = futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(first.as_bytes()))
    })
    .chain(futures_util::stream::pending());
    Body::from_stream(chunks)
}

/// Case 2: a request whose body never finishes does not hold an admission slot; it
/// gets a 408 at the body-read deadline, and a good request beside it succeeds
/// (with one slot and no queue it got 429 before).
#[tokio::test]
async fn a_slow_upload_holds_no_slot_and_times_out_with_408() {
    let fake = FakeBackend::default();
    let config = RouterConfig {
        max_in_flight: 1,
        max_queued: 0,
        body_read_timeout: Duration::from_millis(400),
        ..RouterConfig::default()
    };
    let (app, state) = app_with(&fake, config);
    let slow = tokio::spawn({
        let app = app.clone();
        async move {
            let request = Request::post(CHAT)
                .header("content-type", "application/json")
                .body(trickle("{\"model\": "))
                .unwrap();
            send(&app, request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(state.admission().in_flight(), 0);
    let good = post_json(&app, CHAT, &hello()).await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.text);
    let slow = slow.await.unwrap();
    assert_error(
        &slow,
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        None,
        &["did not arrive within 0.4 s"],
    );
    assert_eq!(slow.json()["error"]["code"], "body_timeout");
}

/// Case 7: a JSON body declared as `text/plain` (what a browser form can send
/// cross-site) is refused with 415 before it is read.
#[tokio::test]
async fn a_body_that_is_not_declared_json_is_415() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let request = Request::post(CHAT)
            .header("content-type", content_type)
            .body(Body::from(hello().to_string()))
            .unwrap();
        let reply = send(&app, request).await;
        assert_error(
            &reply,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            None,
            &[content_type.split(';').next().unwrap(), "application/json"],
        );
    }
    // JSON with parameters and a +json type are read.
    for content_type in [
        "application/json; charset=utf-8",
        "application/vnd.api+json",
    ] {
        let request = Request::post(CHAT).header("content-type", content_type);
        let reply = send(&app, request.body(Body::from(hello().to_string())).unwrap()).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{content_type}: {}",
            reply.text
        );
    }
    assert_eq!(fake.submitted().len(), 2);
}

/// Issue 32, case 2: a browser's `no-cors` fetch of a JSON blob sends no
/// `Content-Type` (and needs no preflight); such a POST is refused with 415.
#[tokio::test]
async fn a_post_without_a_content_type_is_415() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let request = Request::post(CHAT)
        .body(Body::from(hello().to_string()))
        .unwrap();
    let reply = send(&app, request).await;
    assert_error(
        &reply,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request_error",
        None,
        &["no Content-Type", "application/json"],
    );
    assert_eq!(reply.json()["error"]["code"], "unsupported_media_type");
    assert!(fake.submitted().is_empty());
}

fn from_origin(method: http::Method, path: &str, origin: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header("origin", origin)
        .header("content-type", "application/json")
}

/// Issue 32, case 2: a web page of an origin not allowed gets a 403 for every
/// route (preflight included) and nothing is submitted; an allowed origin gets
/// CORS headers and its preflight answered; clients without `Origin` are unaffected.
#[tokio::test]
async fn only_allowed_origins_may_call_the_api() {
    let fake = FakeBackend::default();
    let config = RouterConfig {
        allowed_origins: vec!["https://app.example".into()],
        ..RouterConfig::default()
    };
    let (app, _) = app_with(&fake, config);
    for (method, path) in [
        (http::Method::POST, CHAT),
        (http::Method::GET, "/v1/models"),
        (http::Method::OPTIONS, CHAT),
    ] {
        let request = from_origin(method.clone(), path, "https://evil.example")
            .header("access-control-request-method", "POST")
            .body(Body::from(hello().to_string()))
            .unwrap();
        let reply = send(&app, request).await;
        assert_error(
            &reply,
            StatusCode::FORBIDDEN,
            "permission_error",
            None,
            &["https://evil.example", "--allow-origin"],
        );
        assert_eq!(reply.json()["error"]["code"], "origin_not_allowed");
        assert!(!reply.headers.contains_key("access-control-allow-origin"));
    }
    assert!(fake.submitted().is_empty());
    let preflight = from_origin(http::Method::OPTIONS, CHAT, "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, authorization",
        )
        .body(Body::empty())
        .unwrap();
    let reply = send(&app, preflight).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(
        reply.headers["access-control-allow-methods"],
        "GET, POST, OPTIONS"
    );
    assert_eq!(
        reply.headers["access-control-allow-headers"],
        "content-type, authorization"
    );
    let allowed = from_origin(http::Method::POST, CHAT, "https://app.example")
        .body(Body::from(hello().to_string()))
        .unwrap();
    let reply = send(&app, allowed).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(reply.headers["vary"], "origin");
    let no_origin = post_json(&app, CHAT, &hello()).await;
    assert_eq!(no_origin.status, StatusCode::OK);
    assert!(!no_origin
        .headers
        .contains_key("access-control-allow-origin"));
}

/// With no `--allow-origin`, no web page may call the API at all.
#[tokio::test]
async fn by_default_no_origin_is_allowed() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let request = from_origin(http::Method::POST, CHAT, "http://localhost:3000")
        .body(Body::from(hello().to_string()))
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::FORBIDDEN);
    assert!(fake.submitted().is_empty());
}

/// Case 7: a client-chosen request id is echoed only when short and plain.
#[tokio::test]
async fn long_or_odd_request_ids_are_replaced() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let huge = "a".repeat(60 * 1024);
    for bad in [huge.as_str(), "has space", "semi;colon", "quote\"d"] {
        let request = Request::post(CHAT)
            .header("content-type", "application/json")
            .header("x-request-id", bad)
            .body(Body::from(hello().to_string()))
            .unwrap();
        let reply = send(&app, request).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let echoed = reply.headers["x-request-id"].to_str().unwrap();
        assert_ne!(echoed, bad);
        assert!(uuid_like(echoed), "{echoed}");
        assert_eq!(reply.json()["id"], format!("chatcmpl-{echoed}"));
    }
    let request = Request::post(CHAT)
        .header("content-type", "application/json")
        .header("x-request-id", "trace-42.a:b_c")
        .body(Body::from(hello().to_string()))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.headers["x-request-id"], "trace-42.a:b_c");
}

fn uuid_like(id: &str) -> bool {
    id.len() == 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// Case 7: stop strings and `user` have length caps.
#[tokio::test]
async fn stop_strings_and_user_ids_are_bounded() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let mut long_stop = hello();
    long_stop["stop"] = json!(["ok", "x".repeat(10_000)]);
    let reply = post_json(&app, CHAT, &long_stop).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("stop[1]"),
        &["10000 characters", "at most 256"],
    );
    let mut long_user = hello();
    long_user["user"] = json!("u".repeat(100_000));
    let reply = post_json(&app, CHAT, &long_user).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("user"),
        &["100000 characters"],
    );
    let mut many_biases = hello();
    let bias: serde_json::Map<String, serde_json::Value> =
        (0..5000).map(|i| (i.to_string(), json!(1))).collect();
    many_biases["logit_bias"] = json!(bias);
    let reply = post_json(&app, CHAT, &many_biases).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("logit_bias"),
        &["5000 tokens"],
    );
    assert!(fake.submitted().is_empty());
}

/// Case 7: a dead executor turns `/health` red.
#[tokio::test]
async fn health_sees_the_engine() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    fake.set_healthy(false);
    let reply = get(&app, "/health").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["status"], "unhealthy");
}

/// Case 7: wrong admin tokens wait in one line (at most four guesses a second, however
/// many connections make them); the right token is never held up. On tokio's paused
/// clock, which moves only when every task waits on a timer: the line's turns and the
/// right token's "at once" are exact under any load.
#[tokio::test(start_paused = true)]
async fn wrong_admin_tokens_are_throttled() {
    use switchyard_router::admin::{admin_app, AdminState};
    let admin = admin_app(AdminState::new("right-token-0123456789".into(), None, None));
    let attempt = |token: &'static str| {
        let admin = admin.clone();
        async move {
            let request = Request::get("/admin/models")
                .header("authorization", format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap();
            send(&admin, request).await
        }
    };
    let started = tokio::time::Instant::now();
    let guesses: Vec<_> = (0..8)
        .map(|_| tokio::spawn(attempt("guess-0123456789")))
        .collect();
    // The guesses run up to the line while this waits (one holds it, seven queue).
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The right token gets through while the guesses wait: no timer runs for it.
    let right_started = tokio::time::Instant::now();
    let right = attempt("right-token-0123456789").await;
    assert_ne!(right.status, StatusCode::UNAUTHORIZED, "{}", right.text);
    assert_eq!(
        right_started.elapsed(),
        Duration::ZERO,
        "the right token waited"
    );
    for guess in guesses {
        assert_eq!(guess.await.unwrap().status, StatusCode::UNAUTHORIZED);
    }
    // Eight guesses took at least eight turns of 250 ms.
    assert!(started.elapsed() >= Duration::from_millis(2000));
}
