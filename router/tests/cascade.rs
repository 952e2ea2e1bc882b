//! `[cascade]` over the fake backend: `auto` answers with the first model, defers to the
//! next when the answer's confidence is below the threshold, and says so in headers and
//! metrics; a stream waits for the verdict and streams the answer that stands.
//!
//! The fake's token `i` has log-probability -0.1 × (i + 1), so a 5-token answer's lowest
//! token is at -0.5 and so is its 10% quantile (nearest rank of 5 tokens: the first).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod policy_support;
mod support;

use std::sync::Arc;

use http::StatusCode;
use serde_json::json;

use policy_support::{chat_body, fake_serving, header, policy_app};
use support::get;

fn policy(min_confidence: f64) -> String {
    format!(
        r#"
[routing]
allow_anonymous = true

[[models]]
name = "small"
version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[models]]
name = "large"
version = "v1"
cost_per_1k_input = 0.5
cost_per_1k_output = 1.0
quality = 0.9
context_limit = 64

[[tenants]]
name = "big-only"
api_keys = ["sha256:{key}"]
allowed_models = ["large"]

[cascade]
models = ["small", "large"]
confidence = "p10"
min_confidence = {min_confidence:?}
"#,
        key = switchyard_policies::sha256_hex("sk-big")
    )
}

fn body(stream: bool) -> serde_json::Value {
    json!({"model": "auto", "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn a_sure_answer_is_kept_an_unsure_one_goes_to_the_next_model() {
    let fake = fake_serving(&[("small@v1", 64), ("large@v1", 64)]);
    let (app, store) = policy_app(Arc::new(fake.clone()), &policy(-0.6));

    let reply = chat_body(&app, body(false), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "accepted: p10 -0.50 >= -0.60 over 5 tokens"
    );
    assert!(header(&reply, "x-switchyard-route").starts_with("cascade step 1"));
    assert_eq!(fake.submitted().len(), 1);

    store
        .reload_from_str(&policy(-0.45), "stricter.toml")
        .unwrap();
    let reply = chat_body(&app, body(false), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "deferred from small@v1: p10 -0.50 < -0.45 over 5 tokens"
    );
    assert_eq!(reply.json()["model"], "large@v1");
    let models: Vec<String> = fake
        .submitted()
        .iter()
        .map(|r| r.model.to_string())
        .collect();
    assert_eq!(models[1..], ["small@v1", "large@v1"]);

    // The last step is never judged: naming a model skips the cascade.
    let named = json!({"model": "small", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hi"}]});
    let reply = chat_body(&app, named, &[]).await;
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert!(reply.headers.get("x-switchyard-cascade").is_none());

    // A tenant that may not use the first step gets `auto` as usual.
    let reply = chat_body(&app, body(false), &[("authorization", "Bearer sk-big")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert!(reply.headers.get("x-switchyard-cascade").is_none());

    // A stream waits for the verdict: deferred, the next model's answer is streamed.
    let reply = chat_body(&app, body(true), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "deferred from small@v1: p10 -0.50 < -0.45 over 5 tokens"
    );
    assert!(
        reply.text.contains("\"model\":\"large@v1\""),
        "{}",
        reply.text
    );
    assert!(
        reply.text.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text
    );

    // Accepted, the first model's answer is replayed as it was generated.
    store.reload_from_str(&policy(-0.6), "again.toml").unwrap();
    let reply = chat_body(&app, body(true), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "accepted: p10 -0.50 >= -0.60 over 5 tokens"
    );
    let chunks = reply.text.matches("\"delta\"").count();
    assert!(chunks >= 5, "one chunk per token: {}", reply.text);
    assert!(
        reply.text.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text
    );

    let metrics = get(&app, "/metrics").await.text;
    for line in [
        "switchyard_cascade_total{model=\"small@v1\",outcome=\"accepted\"} 2",
        "switchyard_cascade_total{model=\"small@v1\",outcome=\"deferred\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}

#[test]
fn a_cascade_needs_known_distinct_models_and_a_log_probability() {
    let bad = policy(0.5)
        .replace("[\"small\", \"large\"]", "[\"small\", \"small\", \"huge\"]")
        .replace("\"p10\"", "\"p99\"");
    let error = switchyard_policies::Policy::from_toml_str(&bad)
        .unwrap_err()
        .to_string();
    for expected in [
        "model `small` is listed twice",
        "unknown model `huge`",
        "confidence `p99` is not one of mean, min, p05, p10, p25, p50",
        "min_confidence is a log-probability",
    ] {
        assert!(error.contains(expected), "{expected}: {error}");
    }
}
