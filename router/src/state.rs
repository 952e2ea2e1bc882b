//! What every handler shares: the backend, the limits, the metrics handle.

use std::sync::Arc;
use std::time::Duration;

use crate::layers::shed::Admission;
use crate::metrics::Metrics;
use switchyard_seam::InferenceBackend;

/// The router's limits. `RouterConfig::default()` suits a single-node server.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Deadline for an inference request's whole body to arrive, read before
    /// the request takes an admission slot (408 beyond).
    pub body_read_timeout: Duration,
    /// Deadline for a request to produce its response head: a whole-JSON
    /// completion must finish, a stream must start (504 beyond). Time spent
    /// waiting in the admission queue counts.
    pub request_timeout: Duration,
    /// Inference requests served at once (streams count until they end).
    pub max_in_flight: usize,
    /// Inference requests allowed to wait for a slot; beyond that, 429.
    pub max_queued: usize,
    /// The `Retry-After` sent with a 429.
    pub retry_after: Duration,
    /// Most generations one request may fan out into (`n` × prompts).
    pub max_fanout: u32,
    /// Interval of SSE keep-alive comments while a stream is quiet.
    pub sse_keep_alive: Duration,
    /// What a server started without (`--allow-partial-start`): models that
    /// did not load, policy names not served. `GET /ready` lists them.
    pub missing_at_startup: Vec<String>,
    /// Web origins whose pages may call the API (`--allow-origin`); a request
    /// with any other `Origin` gets 403. Empty: no browser page may.
    pub allowed_origins: Vec<String>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            max_body_bytes: 4 * 1024 * 1024,
            body_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            max_in_flight: 256,
            max_queued: 1024,
            retry_after: Duration::from_secs(1),
            max_fanout: 64,
            sse_keep_alive: Duration::from_secs(15),
            missing_at_startup: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// Shared state of one app. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn InferenceBackend>,
    config: RouterConfig,
    metrics: Metrics,
    admission: Arc<Admission>,
    /// Requests prepared on the blocking pool at once (see [`AppState::heavy_prepares`]).
    heavy_prepares: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// State for `backend` with the given limits, reporting to the
    /// process-wide Prometheus recorder ([`Metrics::global`]).
    pub fn new(backend: Arc<dyn InferenceBackend>, config: RouterConfig) -> Self {
        let admission = Arc::new(Admission::new(
            config.max_in_flight,
            config.max_queued,
            config.retry_after,
        ));
        AppState {
            inner: Arc::new(Inner {
                backend,
                config,
                metrics: Metrics::global(),
                admission,
                heavy_prepares: Arc::new(tokio::sync::Semaphore::new(heavy_prepare_slots())),
            }),
        }
    }

    /// The engine.
    pub fn backend(&self) -> &dyn InferenceBackend {
        self.inner.backend.as_ref()
    }

    /// The limits.
    pub fn config(&self) -> &RouterConfig {
        &self.inner.config
    }

    /// The metrics handle (render, upkeep).
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The admission controller of the inference routes.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    /// Slots for preparing requests on the blocking pool (megabyte prompts and tool
    /// lists, grammar compiles): half the cores, so that a few such requests cannot
    /// take every core from the executor while the others wait their turn.
    pub fn heavy_prepares(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.heavy_prepares
    }
}

fn heavy_prepare_slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}
