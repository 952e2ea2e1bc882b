//! `loadgen fake-server`: a stand-in for `switchyard serve` (same flags for
//! listen and models) that streams `max_tokens` tokens at a fixed pace, so
//! that the harness's own test runs the whole suite (processes, proxy,
//! restarts, metrics scrape, report) in seconds without a model.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(clap::Args, Debug)]
pub struct FakeServerArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    /// Accepted and ignored (the checkpoint a real server would load).
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// The model names it answers to.
    #[arg(long = "model-name")]
    pub model_names: Vec<String>,
    /// Accepted and ignored.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds between tokens.
    #[arg(long, default_value_t = 2)]
    pub token_ms: u64,
    /// Milliseconds before it listens (a model load).
    #[arg(long, default_value_t = 100)]
    pub startup_ms: u64,
}

#[derive(Default)]
struct Fake {
    names: Vec<String>,
    token: Duration,
    swaps: AtomicU64,
    last_model: Mutex<Option<String>>,
}

pub async fn run(args: FakeServerArgs) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_millis(args.startup_ms)).await;
    let fake = Arc::new(Fake {
        names: args.model_names,
        token: Duration::from_millis(args.token_ms),
        ..Fake::default()
    });
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route("/metrics", axum::routing::get(metrics))
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

async fn metrics(State(fake): State<Arc<Fake>>) -> String {
    let swaps = fake.swaps.load(Ordering::Relaxed);
    // A swap costs it a microsecond, as the real engine's pointer swap does.
    format!(
        "switchyard_swaps_total {swaps}\n\
         switchyard_swap_duration_seconds_sum {}\n\
         switchyard_swap_duration_seconds_count {swaps}\n",
        swaps as f64 * 1e-6
    )
}

async fn chat(State(fake): State<Arc<Fake>>, Json(body): Json<serde_json::Value>) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if !fake.names.is_empty() && !fake.names.contains(&model) {
        return (StatusCode::NOT_FOUND, format!("no model `{model}`")).into_response();
    }
    if let Ok(mut last) = fake.last_model.lock() {
        if last.as_deref() != Some(model.as_str()) {
            if last.is_some() {
                fake.swaps.fetch_add(1, Ordering::Relaxed);
            }
            *last = Some(model.clone());
        }
    }
    let tokens = body["max_tokens"].as_u64().unwrap_or(16);
    let pace = fake.token;
    let stream = futures_util::stream::unfold(0u64, move |i| async move {
        let event = if i < tokens {
            tokio::time::sleep(pace).await;
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": "x"}}]})
        } else if i == tokens {
            serde_json::json!({"choices": [], "usage": {"completion_tokens": tokens}})
        } else if i == tokens + 1 {
            return Some((
                Ok::<_, std::io::Error>("data: [DONE]\n\n".to_owned()),
                i + 1,
            ));
        } else {
            return None;
        };
        Some((Ok(format!("data: {event}\n\n")), i + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}
