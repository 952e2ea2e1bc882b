//! A reverse proxy that routes OpenAI requests by their `model` field, the
//! way people serve several models today:
//!
//! - `Replicas`: one running server per model (a dedicated replica each);
//! - `Restart`: one server at a time, restarted with the requested model
//!   when it changes, as llama-swap does: a request for another model waits
//!   until the requests in flight finish, then the old process is stopped and
//!   the new one started and waited for.
//!
//! Responses stream through unchanged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::process::{Server, ServerSpec};

/// What the proxy routes to.
pub enum Backends {
    Replicas(HashMap<String, String>),
    Restart(Arc<Restarter>),
}

/// The restart-on-switch state: which model's server runs now.
pub struct Restarter {
    specs: HashMap<String, ServerSpec>,
    running: Arc<RwLock<Running>>,
    stats: Mutex<RestartStats>,
}

#[derive(Default)]
struct Running {
    model: Option<String>,
    server: Option<Server>,
}

/// What restarting cost, for the report.
#[derive(Clone, Debug, Default)]
pub struct RestartStats {
    pub restarts: u64,
    /// Stop plus start until ready, per restart.
    pub restart_ms: Vec<f64>,
    /// The largest peak resident set of any process it ran.
    pub peak_rss: u64,
}

impl Restarter {
    pub fn new(specs: HashMap<String, ServerSpec>) -> Arc<Restarter> {
        Arc::new(Restarter {
            specs,
            running: Arc::new(RwLock::new(Running::default())),
            stats: Mutex::new(RestartStats::default()),
        })
    }

    /// A read guard on a server running `model`: held for the whole request
    /// so that no restart cuts it off.
    async fn serving(
        &self,
        model: &str,
    ) -> Result<(String, OwnedRwLockReadGuard<Running>), String> {
        let spec = self
            .specs
            .get(model)
            .ok_or_else(|| format!("no server for model `{model}`"))?;
        loop {
            let guard = self.running.clone().read_owned().await;
            if guard.model.as_deref() == Some(model) && guard.server.is_some() {
                return Ok((spec.url(), guard));
            }
            drop(guard);
            // The write lock waits for every request in flight (their read
            // guards) and queues later ones behind the switch (tokio's
            // RwLock is fair), as llama-swap does.
            let mut running = self.running.clone().write_owned().await;
            if running.model.as_deref() == Some(model) && running.server.is_some() {
                continue;
            }
            let started = Instant::now();
            if let Some(old) = running.server.take() {
                self.note_peak(&old);
                old.stop().await;
            }
            running.model = None;
            let server = Server::start(spec).await.map_err(|e| format!("{e:#}"))?;
            running.server = Some(server);
            running.model = Some(model.to_owned());
            if let Ok(mut stats) = self.stats.lock() {
                stats.restarts += 1;
                stats
                    .restart_ms
                    .push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }

    fn note_peak(&self, server: &Server) {
        if let (Some(rss), Ok(mut stats)) = (server.peak_rss(), self.stats.lock()) {
            stats.peak_rss = stats.peak_rss.max(rss);
        }
    }

    /// Stops the running server and returns what restarting cost.
    pub async fn finish(&self) -> RestartStats {
        let mut running = self.running.write().await;
        if let Some(server) = running.server.take() {
            self.note_peak(&server);
            server.stop().await;
        }
        running.model = None;
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Serves the proxy on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backends: Arc<Backends>,
) -> std::io::Result<()> {
    let http = reqwest::Client::new();
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .fallback(forward)
        .with_state((backends, http));
    axum::serve(listener, app).await
}

/// Binds the proxy on a free local port and returns its address.
pub async fn spawn(
    backends: Arc<Backends>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = serve(listener, backends).await {
            eprintln!("proxy: {e}");
        }
    });
    Ok((address, task))
}

async fn forward(
    State((backends, http)): State<(Arc<Backends>, reqwest::Client)>,
    uri: Uri,
    body: Bytes,
) -> Response {
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_owned));
    let Some(model) = model else {
        return (StatusCode::BAD_REQUEST, "proxy: the body names no model").into_response();
    };
    let (base, guard) = match &*backends {
        Backends::Replicas(urls) => match urls.get(&model) {
            Some(url) => (url.clone(), None),
            None => {
                return (StatusCode::NOT_FOUND, format!("proxy: no model `{model}`"))
                    .into_response()
            }
        },
        Backends::Restart(restarter) => match restarter.serving(&model).await {
            Ok((url, guard)) => (url, Some(guard)),
            Err(e) => return (StatusCode::BAD_GATEWAY, format!("proxy: {e}")).into_response(),
        },
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let upstream = match http
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("proxy: {e}")).into_response(),
    };
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = upstream
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    // The guard rides along with the stream: the server stays up until the
    // last byte has gone out.
    let stream = upstream.bytes_stream().map(move |piece| {
        let _keep = &guard;
        piece.map_err(std::io::Error::other)
    });
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}
