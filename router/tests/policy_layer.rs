//! The policy layer over the fake backend: hints, tenants, budgets, fallbacks, splits
//! with automatic rollback, response headers, metrics, and failing closed.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod policy_support;
mod support;

use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use http::StatusCode;
use serde_json::json;
use switchyard_policies::{sha256_hex, RollbackState};
use switchyard_router::{AppState, RouterConfig};
use switchyard_seam::InferenceBackend;

use policy_support::{chat, chat_body, fake_serving, header, policy_app, Refusing};
use support::{assert_error, get, post_json};

const TWO_MODELS: &str = r#"
[routing]
allow_anonymous = true

[[models]]
name = "small"
version = "v1"
aliases = ["cheap"]
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

[[fallbacks]]
model = "large"
on = ["overloaded"]
alternatives = ["small"]
"#;

fn two_models() -> Arc<dyn InferenceBackend> {
    Arc::new(fake_serving(&[("small@v1", 64), ("large@v1", 64)]))
}

#[tokio::test]
async fn hints_pick_the_checkpoint_and_headers_say_why() {
    let fake = fake_serving(&[("small@v1", 64), ("large@v1", 64)]);
    let (app, _) = policy_app(Arc::new(fake.clone()), TWO_MODELS);

    let reply = chat(
        &app,
        "auto",
        "hello",
        &[("x-switchyard-min-quality", "0.8")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(header(&reply, "x-switchyard-version"), "v1");
    assert!(header(&reply, "x-switchyard-route").starts_with("auto: best utility"));
    assert!(header(&reply, "x-switchyard-cost").parse::<f64>().unwrap() > 0.0);
    assert_eq!(reply.json()["model"], "large@v1");
    assert_eq!(
        fake.submitted().last().unwrap().model.to_string(),
        "large@v1"
    );

    // A cost ceiling only the small model meets.
    let reply = chat(&app, "auto", "hello", &[("x-switchyard-max-cost", "0.001")]).await;
    assert_eq!(header(&reply, "x-switchyard-model"), "small");

    // An alias, and a pinned version.
    let reply = chat(&app, "cheap", "hello", &[]).await;
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert!(header(&reply, "x-switchyard-route").contains("alias"));
    let reply = chat(&app, "large@v1", "hello", &[]).await;
    assert_eq!(header(&reply, "x-switchyard-route"), "pinned version");
}

#[tokio::test]
async fn impossible_hints_name_each_candidate_and_constraint() {
    let (app, _) = policy_app(two_models(), TWO_MODELS);
    let reply = chat(
        &app,
        "auto",
        "hello",
        &[("x-switchyard-min-quality", "0.95")],
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        None,
        &[
            "small@v1 (quality 0.500",
            "large@v1 (quality 0.900",
            "floor 0.950",
        ],
    );
    assert_eq!(reply.json()["error"]["code"], "no_candidate");

    let reply = chat(&app, "auto", "hello", &[("x-switchyard-max-cost", "cheap")]).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("x-switchyard-max-cost"),
        &["not a number"],
    );

    let reply = chat(&app, "huge", "hello", &[]).await;
    assert_error(
        &reply,
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("model"),
        &["unknown model `huge`", "large, small"],
    );

    // A prompt the policy knows is too long for every context.
    let long = "word ".repeat(400);
    let reply = chat(&app, "auto", &long, &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.text.contains("above the context limit 64"),
        "{}",
        reply.text
    );
}

#[tokio::test]
async fn body_errors_match_the_handlers() {
    let (app, _) = policy_app(two_models(), TWO_MODELS);
    let reply = support::post_raw(&app, "/v1/chat/completions", "{not json").await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        None,
        &["parse"],
    );
    let reply = post_json(&app, "/v1/chat/completions", &json!({"messages": []})).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("model"),
        &["model"],
    );
    // Refused by validation before routing: nothing is reserved or charged.
    let reply = chat_body(
        &app,
        json!({"model": "small", "messages": [], "max_tokens": 5}),
        &[],
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("messages"),
        &["empty"],
    );
}

const TENANTS: &str = r#"
[routing]
allow_anonymous = false

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
name = "acme"
api_keys = ["sha256:ACME"]
allowed_models = ["small"]

[[tenants.budgets]]
window = "1h"
limit_tokens = 20
"#;

fn tenants_policy() -> String {
    TENANTS.replace("ACME", &sha256_hex("sk-acme"))
}

#[tokio::test]
async fn tenants_are_authenticated_and_permissions_enforced() {
    let (app, _) = policy_app(two_models(), &tenants_policy());
    let reply = chat(&app, "small", "hi", &[]).await;
    assert_error(
        &reply,
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        None,
        &["missing API key"],
    );
    let reply = chat(&app, "small", "hi", &[("authorization", "Bearer sk-wrong")]).await;
    assert_error(
        &reply,
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        None,
        &["not known"],
    );
    let reply = chat(&app, "small", "hi", &[("authorization", "Basic abc")]).await;
    assert_error(
        &reply,
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        None,
        &["Bearer"],
    );
    let reply = chat(&app, "large", "hi", &[("authorization", "Bearer sk-acme")]).await;
    assert_error(
        &reply,
        StatusCode::FORBIDDEN,
        "permission_error",
        None,
        &["large@v1", "tenant `acme` may not use this model"],
    );
    let reply = chat(&app, "small", "hi", &[("authorization", "Bearer sk-acme")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
}

#[tokio::test]
async fn budgets_are_charged_actual_usage_then_exhausted_with_429() {
    let (app, store) = policy_app(two_models(), &tenants_policy());
    let auth = [("authorization", "Bearer sk-acme")];
    // Estimate per request: 1 prompt token + 5 output = 6; the fake reports 2 prompt +
    // 5 completion = 7 actual, which is what is charged.
    for _ in 0..3 {
        let reply = chat(&app, "small", "hi", &auth).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }
    let snapshot = store.current().budgets("acme").unwrap()[0].snapshot();
    assert_eq!((snapshot.settled, snapshot.reserved), (21.0, 0.0));
    let reply = chat(&app, "small", "hi", &auth).await;
    assert_error(
        &reply,
        StatusCode::TOO_MANY_REQUESTS,
        "insufficient_quota",
        None,
        &[
            "Budget exhausted",
            "has 0.000000 left, the request needs 6.000000",
        ],
    );
    assert_eq!(reply.json()["error"]["code"], "budget_exhausted");

    // Tenant spend is for the admin API's /admin/metrics, not the public /metrics.
    let metrics = get(&app, "/metrics").await.text;
    assert!(!metrics.contains("tenant=\"acme\""), "{metrics}");
    assert!(metrics.contains("constraint=\"budget\""), "{metrics}");
    let full = switchyard_router::metrics::Metrics::global().render();
    assert!(
        full.contains("switchyard_policy_spend_tokens_total{tenant=\"acme\"}"),
        "{full}"
    );
}

#[tokio::test]
async fn streams_settle_the_budget_when_they_end() {
    let (app, store) = policy_app(two_models(), &tenants_policy());
    let reply = chat_body(
        &app,
        json!({"model": "small", "max_tokens": 5, "stream": true,
               "messages": [{"role": "user", "content": "hi"}]}),
        &[("authorization", "Bearer sk-acme")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "small");
    assert_eq!(reply.sse_data().last().unwrap(), "[DONE]");
    let snapshot = store.current().budgets("acme").unwrap()[0].snapshot();
    assert_eq!((snapshot.settled, snapshot.reserved), (7.0, 0.0));
}

#[tokio::test]
async fn an_overloaded_checkpoint_falls_back_as_the_policy_says() {
    let fake = fake_serving(&[("small@v1", 64), ("large@v1", 64)]);
    let backend = Refusing::new(fake.clone(), &["large@v1"]);
    let (app, _) = policy_app(backend.clone(), TWO_MODELS);
    for stream in [false, true] {
        let reply = chat_body(
            &app,
            json!({"model": "large", "max_tokens": 5, "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]}),
            &[],
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        assert_eq!(header(&reply, "x-switchyard-model"), "small");
        assert_eq!(
            header(&reply, "x-switchyard-route"),
            "fallback #1 for `large` (large@v1 was overloaded)"
        );
    }
    assert_eq!(
        fake.submitted().last().unwrap().model.to_string(),
        "small@v1"
    );
    let metrics = get(&app, "/metrics").await.text;
    assert!(
        metrics.contains("switchyard_policy_fallbacks_total{from=\"large@v1\",to=\"small@v1\",trigger=\"overloaded\"}"),
        "{metrics}"
    );

    // No fallback for `small`: its overload reaches the client as a 503.
    backend
        .overloaded
        .lock()
        .unwrap()
        .insert("small@v1".to_owned());
    let reply = chat(&app, "small", "hi", &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text
    );
}

const CANARY: &str = r#"
[routing]
allow_anonymous = true

[[models]]
name = "assistant"
versions = ["v1", "v2"]
active_version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[splits]]
name = "canary"
model = "assistant"
sticky = "none"
arms = [
  { name = "stable", target = "assistant@v1", weight = 50 },
  { name = "canary", target = "assistant@v2", weight = 50 },
]

[splits.rollback]
baseline = "stable"
candidate = "canary"
window = "10m"
min_samples = 4
max_error_rate_increase = 0.2
"#;

#[tokio::test]
async fn a_failing_canary_is_rolled_back_automatically() {
    // v2's real context (3 tokens) is far below what the policy says (64): every
    // request the split sends there fails in the engine.
    let fake = fake_serving(&[("assistant@v1", 64), ("assistant@v2", 3)]);
    let (app, store) = policy_app(Arc::new(fake), CANARY);
    let mut failed = 0;
    let mut rolled_back_at = None;
    for i in 0..200 {
        let reply = chat(&app, "assistant", "one two three four", &[]).await;
        if reply.status != StatusCode::OK {
            assert_eq!(header(&reply, "x-switchyard-version"), "v2");
            assert!(reply.text.contains("context"), "{}", reply.text);
            failed += 1;
        }
        if header(&reply, "x-switchyard-route").contains("rolled back") {
            rolled_back_at = Some(i);
            break;
        }
    }
    let rolled_back_at = rolled_back_at.expect("the rollback rule never tripped");
    assert!(failed >= 4, "tripped after {failed} canary failures");
    assert!(
        rolled_back_at < 100,
        "tripped only after {rolled_back_at} requests"
    );
    let status = &store.current().rollback_status()[0];
    assert!(
        matches!(status.state, RollbackState::RolledBack { .. }),
        "{status:?}"
    );
    // From now on every request is served by the stable arm.
    for _ in 0..10 {
        let reply = chat(&app, "assistant", "one two three four", &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        assert_eq!(header(&reply, "x-switchyard-version"), "v1");
    }
    let metrics = get(&app, "/metrics").await.text;
    assert!(
        metrics.contains("switchyard_policy_rollback_tripped{split=\"canary\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("switchyard_policy_split_arm_total{split=\"canary\",arm=\"canary\"}"));
    assert!(metrics.contains("reason=\"rolled_back\""), "{metrics}");
}

#[tokio::test]
async fn completions_are_routed_too() {
    let fake = fake_serving(&[("small@v1", 64), ("large@v1", 64)]);
    let (app, _) = policy_app(Arc::new(fake.clone()), TWO_MODELS);
    let reply = post_json(
        &app,
        "/v1/completions",
        &json!({"model": "auto", "prompt": "hello", "max_tokens": 3}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(header(&reply, "x-switchyard-model"), "large");
    assert_eq!(reply.json()["model"], "large@v1");
}

#[tokio::test]
async fn handlers_fail_closed_without_the_layer() {
    let state = AppState::new(two_models(), RouterConfig::default());
    let bare = Router::new()
        .route(
            "/v1/chat/completions",
            post(switchyard_router::openai::chat::chat_completions),
        )
        .with_state(state);
    let reply = chat(&bare, "small@v1", "hi", &[]).await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        None,
        &["not routed by the policy layer"],
    );
}

#[tokio::test]
async fn without_a_policy_the_model_is_used_as_sent() {
    let fake = fake_serving(&[("small@v1", 64)]);
    let (app, _) = support::app_for(&fake);
    let reply = chat(&app, "small@v1", "hi", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(reply.headers.get("x-switchyard-model").is_none());
    assert_eq!(fake.submitted()[0].model.to_string(), "small@v1");
}

/// A policy of its own, so that its route counters (labelled by model) move only with
/// the test that uses it, whatever runs beside it.
const PARSE_FIRST: &str = r#"
[routing]
allow_anonymous = false

[[models]]
name = "parse-first"
version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[tenants]]
name = "parse-first-tenant"
api_keys = ["sha256:KEY"]

[[tenants.budgets]]
window = "1h"
limit_tokens = 100
"#;

/// Requests routed to `parse-first` so far, as the process's metrics count them.
fn parse_first_routed() -> f64 {
    switchyard_router::metrics::Metrics::global()
        .render()
        .lines()
        .filter(|line| {
            line.starts_with("switchyard_policy_routed_total{")
                && line.contains("model=\"parse-first\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Parse, then route: a body that does not validate is refused naming the field before
/// routing runs (so before credentials are read), reserves no budget and moves no route
/// counter; a valid one is routed and served from the same validated value.
#[tokio::test]
async fn invalid_requests_are_refused_before_routing_and_reserve_nothing() {
    let policy = PARSE_FIRST.replace("KEY", &sha256_hex("sk-parse-first"));
    let (app, store) = policy_app(Arc::new(fake_serving(&[("parse-first@v1", 64)])), &policy);
    let auth = [("authorization", "Bearer sk-parse-first")];
    let routed_before = parse_first_routed();
    let invalid = [
        json!({"model": "parse-first", "max_tokens": 2, "temperature": "hot",
               "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "parse-first", "max_tokens": 2, "temperature": 7,
               "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "parse-first", "max_tokens": 2, "messages": []}),
        json!({"model": "parse-first", "max_tokens": 2, "n": 1000,
               "messages": [{"role": "user", "content": "hi"}]}),
    ];
    let params = ["temperature", "temperature", "messages", "n"];
    for (body, param) in invalid.iter().zip(params) {
        // A wrong key too: the body is refused first, credentials are never read.
        for headers in [&auth[..], &[("authorization", "Bearer sk-wrong")][..]] {
            let reply = chat_body(&app, body.clone(), headers).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
            assert_eq!(reply.json()["error"]["param"], param, "{}", reply.text);
            assert!(reply.headers.get("x-switchyard-model").is_none());
        }
    }
    let budget = store.current().budgets("parse-first-tenant").unwrap()[0].snapshot();
    assert_eq!((budget.settled, budget.reserved), (0.0, 0.0));
    assert_eq!(parse_first_routed(), routed_before);

    // A well-formed body is routed and served from the layer's one parse.
    let good = json!({"model": "parse-first", "max_tokens": 2,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let reply = chat_body(&app, good, &auth).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["model"], "parse-first@v1");
    assert_eq!(parse_first_routed(), routed_before + 1.0);
    let budget = store.current().budgets("parse-first-tenant").unwrap()[0].snapshot();
    assert!(budget.settled > 0.0, "{budget:?}");
}
