//! What an inference gateway reads from a model server besides the
//! completions: each model's `parent` in `GET /v1/models`, and the series
//! that scrape sources add to `GET /metrics`.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::StatusCode;
use serde_json::json;
use support::{app_for, get};
use switchyard_router::fake::FakeBackend;
use switchyard_router::metrics::{add_scrape_source, ScrapeSource};
use switchyard_seam::ModelCard;

fn card(id: &str) -> ModelCard {
    ModelCard {
        parent: None,
        id: id.to_owned(),
        created: 1_700_000_123,
        owned_by: "switchyard".to_owned(),
        context_length: 2048,
    }
}

#[tokio::test]
async fn versions_name_their_model_as_parent() {
    let fake = FakeBackend::builder()
        .models(vec![
            card("smollm2"),
            card("smollm2@2"),
            card("org/big@v1.5"),
        ])
        .build();
    let (app, _) = app_for(&fake);
    let reply = get(&app, "/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let data = reply.json()["data"].clone();
    assert_eq!(data[0]["id"], "smollm2");
    assert!(data[0].get("parent").is_none(), "{data}");
    assert_eq!(data[1]["parent"], json!("smollm2"));
    assert_eq!(data[2]["parent"], json!("org/big"));
    let reply = get(&app, "/v1/models/smollm2@2").await;
    assert_eq!(reply.json()["parent"], json!("smollm2"));
}

/// Counts its scrapes, so the test sees the value computed at each one.
struct Scrapes(AtomicUsize);

impl ScrapeSource for Scrapes {
    fn render(&self, out: &mut String) {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        out.push_str("# HELP test_scrapes Scrapes so far\n# TYPE test_scrapes gauge\n");
        out.push_str(&format!("test_scrapes {n}\n"));
    }
}

#[tokio::test]
async fn scrape_sources_are_rendered_at_each_scrape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    add_scrape_source(Arc::new(Scrapes(AtomicUsize::new(0))));
    let first = get(&app, "/metrics").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.text.lines().any(|l| l == "test_scrapes 1"),
        "{}",
        first.text
    );
    let second = get(&app, "/metrics").await;
    assert!(
        second.text.lines().any(|l| l == "test_scrapes 2"),
        "{}",
        second.text
    );
    // Exactly one declaration per scrape, after the recorder's families.
    assert_eq!(second.text.matches("# TYPE test_scrapes gauge").count(), 1);
}
