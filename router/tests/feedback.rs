//! `POST /v1/feedback` over the fake backend: a client scores the answer it got, once,
//! by the response id; another tenant cannot; the tallies per checkpoint and split arm
//! (with the answers' confidence beside them) show in `/admin/policy`.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod policy_support;
mod support;

use std::sync::Arc;

use http::StatusCode;
use serde_json::json;
use switchyard_policies::sha256_hex;

use policy_support::{chat_body, fake_serving, policy_app};
use support::{send, Reply};

async fn post_json(
    app: &axum::Router,
    path: &str,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = http::Request::post(path).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(
        app,
        request
            .body(axum::body::Body::from(body.to_string()))
            .unwrap(),
    )
    .await
}

fn policy() -> String {
    format!(
        r#"
[[models]]
name = "m"
versions = ["v1", "v2"]
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[tenants]]
name = "acme"
api_keys = ["sha256:{}"]

[[tenants]]
name = "other"
api_keys = ["sha256:{}"]

[[splits]]
name = "rollout"
model = "m"
sticky = "none"
arms = [{{ name = "base", target = "m@v1", weight = 100.0 }},
        {{ name = "canary", target = "m@v2", weight = 0.0 }}]
"#,
        sha256_hex("sk-acme"),
        sha256_hex("sk-other")
    )
}

#[tokio::test]
async fn an_answer_takes_one_score_from_its_own_caller() {
    let fake = fake_serving(&[("m@v1", 64), ("m@v2", 64)]);
    let (app, store) = policy_app(Arc::new(fake), &policy());
    let acme = [("authorization", "Bearer sk-acme")];
    let other = [("authorization", "Bearer sk-other")];
    let body =
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let reply = chat_body(&app, body, &acme).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let id = reply.json()["id"].as_str().unwrap().to_owned();

    let score = |score: serde_json::Value| json!({"id": id, "score": score});
    let r = post_json(&app, "/v1/feedback", score(json!(0.8)), &other).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = post_json(&app, "/v1/feedback", score(json!(2)), &acme).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.json()["error"]["param"], "score");
    let r = post_json(&app, "/v1/feedback", json!({"id": id}), &acme).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = post_json(&app, "/v1/feedback", score(json!(0.8)), &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let r = post_json(&app, "/v1/feedback", score(json!(0.8)), &acme).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["checkpoint"], "m@v1");
    assert_eq!(r.json()["arm"], "rollout/base");
    let r = post_json(&app, "/v1/feedback", score(json!(0.1)), &acme).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);

    let signals = store.feedback().signals();
    assert_eq!(signals.len(), 1);
    let base = &signals[0];
    assert_eq!(
        (base.checkpoint.as_str(), base.arm.as_deref()),
        ("m@v1", Some("rollout/base"))
    );
    assert_eq!(base.feedback.unwrap().n, 1);
    assert_eq!(base.feedback.unwrap().mean, 0.8);
    // The fake's 5 tokens have log-probabilities -0.1 .. -0.5: mean -0.3.
    let confidence = base.confidence.unwrap();
    assert_eq!(confidence.n, 1);
    assert!((confidence.mean + 0.3).abs() < 1e-6, "{confidence:?}");
}
