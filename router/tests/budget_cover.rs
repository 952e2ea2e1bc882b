//! Reservations that cover the real spend: the prompt as the backend encodes it (chat
//! template included), times the generations, plus `max_tokens`, held before anything
//! runs. Many clients at once against one budget are never billed past its limit.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod policy_support;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::StatusCode;
use serde_json::json;
use switchyard_policies::sha256_hex;
use switchyard_router::fake::FakeBackend;
use switchyard_seam::{ModelCard, Prompt};

use policy_support::{chat_body, policy_app};

const POLICY: &str = r#"
[routing]
allow_anonymous = false

[[models]]
name = "small"
version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[tenants]]
name = "acme"
api_keys = ["sha256:ACME"]

[[tenants.budgets]]
window = "1h"
limit_tokens = 100
"#;

/// Twelve one-letter words: about 6 tokens by the characters-over-four estimate, 13 as
/// the fake encodes them (a token per word, one for the message).
const DENSE: &str = "a a a a a a a a a a a a";

fn fake(encodes: bool) -> FakeBackend {
    let builder = FakeBackend::builder()
        .models(vec![ModelCard {
            parent: None,
            id: "small@v1".to_owned(),
            created: 1_700_000_000,
            owned_by: "test".to_owned(),
            context_length: 64,
        }])
        .held();
    if encodes {
        builder.encodes_prompts().build()
    } else {
        builder.build()
    }
}

/// Sends `clients` requests at once while the backend holds every generation, so that
/// every admitted request is reserved before any settles; returns the statuses and the
/// total billed.
async fn burst(encodes: bool, clients: usize) -> (Vec<StatusCode>, u64, f64) {
    let backend = fake(encodes);
    let (app, store) = policy_app(
        Arc::new(backend.clone()),
        &POLICY.replace("ACME", &sha256_hex("sk-acme")),
    );
    // Replies in before the release: the refused (a held generation cannot end).
    let answered = AtomicUsize::new(0);
    let sends = (0..clients).map(|_| {
        let (app, answered) = (app.clone(), &answered);
        async move {
            let reply = chat_body(
                &app,
                json!({"model": "small", "max_tokens": 5,
                       "messages": [{"role": "user", "content": DENSE}]}),
                &[("authorization", "Bearer sk-acme")],
            )
            .await;
            answered.fetch_add(1, Ordering::SeqCst);
            reply
        }
    });
    let release = async {
        // Once every request has been routed: refused (answered) or held (submitted).
        // A timed wait released early on a busy machine, and the late requests then
        // met settled spends instead of holds.
        let routed = || backend.submitted().len() + answered.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while routed() < clients {
            assert!(
                Instant::now() < deadline,
                "{} of {clients} routed",
                routed()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        backend.release();
    };
    let (replies, ()) = tokio::join!(join_all(sends), release);
    let mut billed = 0;
    for reply in &replies {
        if reply.status == StatusCode::OK {
            billed += reply.json()["usage"]["total_tokens"].as_u64().unwrap();
        }
    }
    let settled = store.current().budgets("acme").unwrap()[0]
        .snapshot()
        .settled;
    (replies.iter().map(|r| r.status).collect(), billed, settled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_are_never_billed_past_the_limit() {
    let (statuses, billed, settled) = burst(true, 20).await;
    assert!(billed <= 100, "billed {billed} of a 100-token budget");
    assert_eq!(settled, billed as f64);
    // 13 prompt + 5 output = 18 per request: at most five fit in 100. Fewer may be
    // served: a request whose real count no longer fits beside the others' holds is
    // refused rather than run.
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!((1..=5).contains(&served), "{statuses:?}");
    assert_eq!(billed, 18 * served as u64);
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_routing_estimate_alone_would_overspend() {
    // The same burst over a backend that cannot encode before submitting: only the
    // characters-over-four estimate is held, and the budget is overspent. This is
    // what `cover` prevents (and why the engine implements `encode_prompt`).
    let (_, billed, _) = burst(false, 20).await;
    assert!(billed > 100, "billed {billed}");
}

#[tokio::test]
async fn the_encoded_prompt_is_what_runs_and_n_choices_count_each() {
    let backend = FakeBackend::builder()
        .models(vec![ModelCard {
            parent: None,
            id: "small@v1".to_owned(),
            created: 1_700_000_000,
            owned_by: "test".to_owned(),
            context_length: 64,
        }])
        .encodes_prompts()
        .build();
    let (app, store) = policy_app(
        Arc::new(backend.clone()),
        &POLICY.replace("ACME", &sha256_hex("sk-acme")),
    );
    // Two choices hold 2 × (13 + 5) = 36 and are billed 13 + 2 × 5 = 23 (the prompt
    // once); five more would hold 90 of the 77 left.
    let ask = |n: u32| {
        chat_body(
            &app,
            json!({"model": "small", "max_tokens": 5, "n": n,
                   "messages": [{"role": "user", "content": DENSE}]}),
            &[("authorization", "Bearer sk-acme")],
        )
    };
    let reply = ask(2).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let submitted = backend.submitted();
    assert_eq!(submitted.len(), 2);
    assert!(submitted.iter().all(|r| matches!(
        &r.prompt,
        Prompt::Encoded { ids, chat: true } if ids.len() == 13
    )));
    assert_eq!(
        store.current().budgets("acme").unwrap()[0]
            .snapshot()
            .settled,
        23.0
    );
    let reply = ask(5).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text
    );
    assert_eq!(reply.json()["error"]["code"], "budget_exhausted");
    // The refused request ran nothing and holds nothing.
    assert_eq!(backend.submitted().len(), 2);
    let budget = store.current().budgets("acme").unwrap()[0].snapshot();
    assert_eq!(budget.reserved, 0.0);
}
