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
use switchyard_router::fake::FakeBackend;
use switchyard_seam::{MarginStatistic, ModelCard, UnsureStop};

fn policy(min_confidence: f64) -> String {
    policy_on("p10", min_confidence)
}

fn policy_on(statistic: &str, min_confidence: f64) -> String {
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

[[tenants]]
name = "small-only"
api_keys = ["sha256:{small}"]
allowed_models = ["small"]

[cascade]
models = ["small", "large"]
confidence = "{statistic}"
min_confidence = {min_confidence:?}
"#,
        key = switchyard_policies::sha256_hex("sk-big"),
        small = switchyard_policies::sha256_hex("sk-small"),
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
        "deferred from small@v1: p10 -0.50 < -0.45 over 5 tokens; the attempt ran to its end (2 prompt + 5 generated tokens)"
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
        "deferred from small@v1: p10 -0.50 < -0.45 over 5 tokens; the attempt ran to its end (2 prompt + 5 generated tokens)"
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

/// Under `margin`, on version v7 (the metrics are the process's: apart from the other
/// test's).
fn margin_policy(min_confidence: f64) -> String {
    policy_on("margin", min_confidence).replace("\"v1\"", "\"v7\"")
}

/// The fake's every token has a top-2 margin of 1 nat: under `margin` 1.5 the first model
/// is stopped after its first token and the request escalates; under 0.5 it goes on.
#[tokio::test]
async fn a_first_token_margin_escalates_after_one_token() {
    let fake = fake_serving(&[("small@v7", 64), ("large@v7", 64)]);
    let (app, store) = policy_app(Arc::new(fake.clone()), &margin_policy(1.5));
    let stop = Some(UnsureStop {
        statistic: MarginStatistic::Margin,
        min: 1.5,
        every_token: false,
    });
    let early = "deferred from small@v7: margin 1.00 < 1.50 on the first token; the attempt stopped after its first token (2 prompt + 1 generated tokens)";

    let reply = chat_body(&app, body(false), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(header(&reply, "x-switchyard-cascade"), early);
    let submitted = fake.submitted();
    assert_eq!(
        submitted[0].stop_unsure, stop,
        "the first step carries the stop"
    );
    assert_eq!(
        submitted[1].stop_unsure, None,
        "the last step is never stopped"
    );
    // The answer is the large model's, whole.
    assert_eq!(reply.json()["usage"]["completion_tokens"], 5);

    // Streamed: the same early escalation, the large model's answer streamed.
    let reply = chat_body(&app, body(true), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-cascade"), early);
    assert!(
        reply.text.contains("\"model\":\"large@v7\""),
        "{}",
        reply.text
    );
    assert!(
        reply.text.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text
    );

    // When the next model cannot take it, the first model answers again in full,
    // without the stop.
    let before = fake.submitted().len();
    let reply = chat_body(&app, body(false), &[("authorization", "Bearer sk-small")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "accepted: margin 1.00 < 1.50 on the first token; `large` cannot take the request"
    );
    assert_eq!(reply.json()["usage"]["completion_tokens"], 5);
    let again: Vec<_> = fake.submitted()[before..]
        .iter()
        .map(|r| (r.model.to_string(), r.stop_unsure))
        .collect();
    assert_eq!(
        again,
        [
            ("small@v7".to_string(), stop),
            ("small@v7".to_string(), None)
        ]
    );

    // Sure enough: the stream starts after the first token and goes on live.
    store
        .reload_from_str(&margin_policy(0.5), "lenient.toml")
        .unwrap();
    let reply = chat_body(&app, body(true), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert_eq!(
        header(&reply, "x-switchyard-cascade"),
        "accepted: margin 1.00 >= 0.50 on the first token"
    );
    assert!(
        reply.text.matches("\"delta\"").count() >= 5,
        "{}",
        reply.text
    );
    assert!(
        reply.text.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text
    );
    let whole = chat_body(&app, body(false), &[]).await;
    assert_eq!(header(&whole, "x-switchyard-model"), "small");
    let confidence: switchyard_seam::TokenConfidence =
        header(&whole, "x-switchyard-confidence").parse().unwrap();
    assert_eq!(confidence.first.map(|m| m.margin), Some(1.0));
    assert_eq!(confidence.tokens, 5);

    let metrics = get(&app, "/metrics").await.text;
    for line in [
        "switchyard_cascade_stopped_early_total{model=\"small@v7\"} 2",
        "switchyard_cascade_total{model=\"small@v7\",outcome=\"deferred\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}

/// Under `min_margin` the first model's step carries an every-token stop: the fake
/// (every margin 1 nat) is stopped at its first token, which is its first unsure one, and
/// the verdict is the whole (stopped) answer's, streamed or not.
#[tokio::test]
async fn min_margin_stops_the_first_model_at_an_unsure_token() {
    let fake = fake_serving(&[("small@v9", 64), ("large@v9", 64)]);
    let policy = policy_on("min_margin", 1.5).replace("\"v1\"", "\"v9\"");
    let (app, _store) = policy_app(Arc::new(fake.clone()), &policy);
    let early = "deferred from small@v9: min_margin 1.00 < 1.50 over 1 tokens; the attempt stopped at its first unsure token (2 prompt + 1 generated tokens)";
    for stream in [false, true] {
        let reply = chat_body(&app, body(stream), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        assert_eq!(header(&reply, "x-switchyard-model"), "large");
        assert_eq!(header(&reply, "x-switchyard-cascade"), early);
    }
    let submitted = fake.submitted();
    assert_eq!(
        submitted[0].stop_unsure,
        Some(UnsureStop {
            statistic: MarginStatistic::Margin,
            min: 1.5,
            every_token: true,
        })
    );
    assert_eq!(submitted[1].stop_unsure, None);
    let metrics = get(&app, "/metrics").await.text;
    let line = "switchyard_cascade_stopped_early_total{model=\"small@v9\"} 2";
    assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
}

/// Under `min_margin` with `handoff = true`: the fake's third token (" brown") is
/// unsure, so the first model is stopped there and the next model is given the two sure
/// tokens ("The quick") as the start of its answer, with what is left of `max_tokens`.
/// The answer is the kept text followed by the continuation (the fake's reply again: it
/// does not read its prompt), whole or streamed; headers and metrics say what was kept.
#[tokio::test]
async fn a_handoff_continues_the_first_models_sure_tokens() {
    let fake = FakeBackend::builder()
        .models(
            ["small@v11", "large@v11"]
                .iter()
                .map(|id| ModelCard {
                    parent: None,
                    id: (*id).to_owned(),
                    created: 1_700_000_000,
                    owned_by: "test".to_owned(),
                    context_length: 64,
                })
                .collect(),
        )
        .unsure_at(2)
        .build();
    let handoff = format!(
        "{}handoff = true\n",
        policy_on("min_margin", 0.5).replace("\"v1\"", "\"v11\"")
    );
    let (app, store) = policy_app(Arc::new(fake.clone()), &handoff);
    let verdict = "deferred from small@v11: min_margin 0.25 < 0.50 over 3 tokens; the attempt stopped at its first unsure token (2 prompt + 3 generated tokens); handed off: large@v11 continues its first 2 tokens";
    let answer = "The quickThe quick brown";

    let reply = chat_body(&app, body(false), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(header(&reply, "x-switchyard-cascade"), verdict);
    assert_eq!(
        header(&reply, "x-switchyard-handoff"),
        "from=small@v11 kept=2 to=large@v11"
    );
    let json = reply.json();
    assert_eq!(json["choices"][0]["message"]["content"], answer);
    // `usage` is the continuing model's: 5 asked, 2 kept, 3 continued.
    assert_eq!(json["usage"]["completion_tokens"], 3);
    let submitted = fake.submitted();
    let continued = &submitted[1];
    assert_eq!(continued.model.to_string(), "large@v11");
    assert_eq!(continued.answer_prefix.as_deref(), Some("The quick"));
    assert_eq!(continued.max_tokens, Some(3));
    assert_eq!(continued.stop_unsure, None);

    // Streamed: the kept tokens first, then the continuation.
    let reply = chat_body(&app, body(true), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-cascade"), verdict);
    let streamed: String = reply
        .sse_data()
        .iter()
        .filter(|data| data.as_str() != "[DONE]")
        .filter_map(|data| {
            let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, answer);
    assert!(
        reply.text.trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text
    );

    // Without the handoff the next model starts from scratch.
    store
        .reload_from_str(
            &policy_on("min_margin", 0.5).replace("\"v1\"", "\"v11\""),
            "plain.toml",
        )
        .unwrap();
    let reply = chat_body(&app, body(false), &[]).await;
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert!(reply.headers.get("x-switchyard-handoff").is_none());
    assert_eq!(
        reply.json()["choices"][0]["message"]["content"],
        "The quick brown fox jumps"
    );
    let last = fake.submitted().pop().unwrap();
    assert_eq!((last.answer_prefix, last.max_tokens), (None, Some(5)));

    let metrics = get(&app, "/metrics").await.text;
    for line in [
        "switchyard_cascade_handoff_total{from=\"small@v11\",to=\"large@v11\"} 2",
        "switchyard_cascade_kept_tokens_total{model=\"small@v11\"} 4",
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
        "confidence `p99` is not one of mean, min, p05, p10, p25, p50, margin, neg_entropy, min_margin",
        "min_confidence of `p10` is a log-probability",
    ] {
        assert!(error.contains(expected), "{expected}: {error}");
    }
}
