//! Prometheus metrics: names, the recorder, and the `GET /metrics` handler.
//!
//! The `metrics` facade has one process-wide recorder, so [`Metrics::global`]
//! installs a Prometheus recorder once (through a `OnceLock`) and every app
//! built afterwards — several per test binary, say — shares it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::thread::LocalKey;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::header;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Counter: HTTP requests by `path`, `model` and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "switchyard_http_requests_total";
/// Histogram: HTTP request duration (to the end of the body, streams
/// included) by `path`, `model` and `status`.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "switchyard_http_request_duration_seconds";
/// Gauge: HTTP requests being served, streams included.
pub const HTTP_REQUESTS_IN_FLIGHT: &str = "switchyard_http_requests_in_flight";
/// Counter: requests refused by load shedding.
pub const HTTP_REQUESTS_SHED_TOTAL: &str = "switchyard_http_requests_shed_total";
/// Histogram: time from submission to the first token of a generation, by `model`.
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "switchyard_time_to_first_token_seconds";
/// Counter: tokens generated, by `model`.
pub const GENERATED_TOKENS_TOTAL: &str = "switchyard_generated_tokens_total";
/// Counter: prompt tokens processed, by `model`.
pub const PROMPT_TOKENS_TOTAL: &str = "switchyard_prompt_tokens_total";
/// Gauge: requests waiting in the engine's queue, by `model` (set by the backend).
pub const ENGINE_QUEUE_DEPTH: &str = "switchyard_engine_queue_depth";

/// Latency buckets in seconds: from a fast cache hit to a long generation.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Histogram: time from the scheduler's decision to switch checkpoints to
/// the next forward reading the new weights (set by the engine).
pub const SWAP_DURATION_SECONDS: &str = "switchyard_swap_duration_seconds";
/// Histogram: rows (tokens) per forward step, by `model` and `version`.
pub const STEP_ROWS: &str = "switchyard_step_rows";

/// Swap buckets in seconds: a pointer swap takes microseconds.
const SWAP_BUCKETS: &[f64] = &[
    1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3, 1e-2,
];

/// Batch-size buckets in rows.
const ROW_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// A handle on the process-wide Prometheus recorder.
#[derive(Clone, Debug)]
pub struct Metrics {
    handle: PrometheusHandle,
}

static GLOBAL: OnceLock<Metrics> = OnceLock::new();

impl Metrics {
    /// The process-wide recorder, installed on first call.
    ///
    /// If some other recorder was installed first, this one still works as a
    /// handle but stays empty; a warning says so.
    pub fn global() -> Metrics {
        GLOBAL.get_or_init(Metrics::install).clone()
    }

    fn install() -> Metrics {
        let builder = PrometheusBuilder::new();
        let builder = match builder
            .set_buckets_for_metric(
                Matcher::Full(SWAP_DURATION_SECONDS.to_owned()),
                SWAP_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(STEP_ROWS.to_owned()), ROW_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
            }) {
            Ok(builder) => builder,
            Err(err) => {
                // Only an empty bucket list fails, and ours is a constant.
                tracing::error!(%err, "could not set histogram buckets; using summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if let Err(err) = metrics::set_global_recorder(recorder) {
            tracing::warn!(%err, "another metrics recorder is installed; /metrics will be empty");
        }
        describe();
        Metrics { handle }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// [`Metrics::render`] without the series labelled by tenant or prompt-cache scope
    /// (names, spend and cache use of the operator's customers), for the
    /// unauthenticated public `/metrics`; the admin API's `/admin/metrics` serves them.
    pub fn render_public(&self) -> String {
        let full = self.render();
        let mut public = String::with_capacity(full.len());
        let private = |line: &str| line.contains("tenant=\"") || line.contains("cache_scope=\"");
        for line in full.lines().filter(|line| !private(line)) {
            public.push_str(line);
            public.push('\n');
        }
        public
    }

    /// Drains histogram buffers so memory stays bounded between scrapes.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Runs [`Metrics::run_upkeep`] every `every` until the task is aborted.
    pub fn spawn_upkeep(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let metrics = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            loop {
                ticker.tick().await;
                metrics.run_upkeep();
            }
        })
    }
}

fn describe() {
    metrics::describe_counter!(
        HTTP_REQUESTS_TOTAL,
        "HTTP requests by path, model and status"
    );
    metrics::describe_histogram!(
        HTTP_REQUEST_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "HTTP request duration to the end of the response body"
    );
    metrics::describe_gauge!(HTTP_REQUESTS_IN_FLIGHT, "HTTP requests being served");
    metrics::describe_counter!(
        HTTP_REQUESTS_SHED_TOTAL,
        "Requests refused by load shedding"
    );
    metrics::describe_histogram!(
        TIME_TO_FIRST_TOKEN_SECONDS,
        metrics::Unit::Seconds,
        "Time from submission to the first generated token"
    );
    metrics::describe_counter!(GENERATED_TOKENS_TOTAL, "Tokens generated");
    metrics::describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens processed");
    metrics::describe_gauge!(ENGINE_QUEUE_DEPTH, "Requests waiting in the engine queue");
}

/// Sets the engine queue depth gauge for `model`; the backend calls this.
pub fn set_queue_depth(model: &str, depth: usize) {
    metrics::gauge!(ENGINE_QUEUE_DEPTH, "model" => model.to_owned()).set(depth as f64);
}

/// Metric handles by label key, one map per thread (see [`cached_handles`]).
pub(crate) type HandleCache<T> = RefCell<HashMap<Box<str>, T>>;

/// The handles registered for `key` (the label values, joined), registering them with
/// `register` the first time this thread asks. A request then hashes one short key
/// instead of building its labels and looking each series up in the recorder. Keys come
/// from bounded sets (route patterns, served models, status codes), so the maps stay
/// small; the recorder is installed before anything is served, so no cached handle
/// points at a recorder that is gone.
pub(crate) fn cached_handles<T: Clone>(
    cache: &'static LocalKey<HandleCache<T>>,
    key: fmt::Arguments<'_>,
    register: impl FnOnce() -> T,
) -> T {
    thread_local! {
        /// The key being looked up, kept so that a lookup does not allocate.
        static KEY: RefCell<String> = RefCell::default();
    }
    KEY.with_borrow_mut(|text| {
        text.clear();
        let _ = text.write_fmt(key);
        cache.with_borrow_mut(|known| {
            if let Some(handles) = known.get(text.as_str()) {
                return handles.clone();
            }
            let handles = register();
            known.insert(text.as_str().into(), handles.clone());
            handles
        })
    })
}

/// The per-model series one generation updates, looked up once per
/// generation rather than once per token.
#[derive(Clone)]
pub struct GenerationMetrics {
    time_to_first_token: metrics::Histogram,
    generated_tokens: metrics::Counter,
    prompt_tokens: metrics::Counter,
}

impl GenerationMetrics {
    /// The series for `model`, which must be a served model's name (label
    /// values come from a bounded set, never straight from a request).
    pub fn for_model(model: &str) -> Self {
        thread_local! {
            static BY_MODEL: HandleCache<GenerationMetrics> = HandleCache::default();
        }
        cached_handles(&BY_MODEL, format_args!("{model}"), || {
            let label = model.to_owned();
            GenerationMetrics {
                time_to_first_token: metrics::histogram!(TIME_TO_FIRST_TOKEN_SECONDS, "model" => label.clone()),
                generated_tokens: metrics::counter!(GENERATED_TOKENS_TOTAL, "model" => label.clone()),
                prompt_tokens: metrics::counter!(PROMPT_TOKENS_TOTAL, "model" => label),
            }
        })
    }

    /// Records the time from submission to the first token.
    pub fn first_token(&self, elapsed: Duration) {
        self.time_to_first_token.record(elapsed.as_secs_f64());
    }

    /// Counts one generated token.
    pub fn token(&self) {
        self.generated_tokens.increment(1);
        GENERATED_TOKENS.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the prompt tokens of a finished generation.
    pub fn prompt(&self, tokens: u32) {
        self.prompt_tokens.increment(u64::from(tokens));
        PROMPT_TOKENS.fetch_add(u64::from(tokens), Ordering::Relaxed);
    }
}

/// Process-wide token totals over every model, kept beside the Prometheus
/// series because a recorder's counters cannot be read back: the admin
/// console's throughput chart samples them.
static GENERATED_TOKENS: AtomicU64 = AtomicU64::new(0);
static PROMPT_TOKENS: AtomicU64 = AtomicU64::new(0);

/// Tokens generated and prompt tokens processed since the process started,
/// over every model.
pub fn token_totals() -> TokenTotals {
    TokenTotals {
        generated: GENERATED_TOKENS.load(Ordering::Relaxed),
        prompt: PROMPT_TOKENS.load(Ordering::Relaxed),
    }
}

/// See [`token_totals`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenTotals {
    /// Tokens generated.
    pub generated: u64,
    /// Prompt tokens processed (counted when a generation finishes).
    pub prompt: u64,
}

/// Series computed from live state when `/metrics` is scraped, rather than
/// recorded as events happen: gauges that must agree with the state at the
/// moment of the scrape, or whose label set changes (one current series, no
/// stale ones left behind). Writes complete families in the Prometheus text
/// format, under names the recorder does not use.
pub trait ScrapeSource: Send + Sync {
    /// Appends this source's families to `out`.
    fn render(&self, out: &mut String);
}

/// The scrape sources, process-wide like the recorder.
static SCRAPE_SOURCES: RwLock<Vec<Arc<dyn ScrapeSource>>> = RwLock::new(Vec::new());

/// Adds `source` to every later `/metrics` response of this process.
pub fn add_scrape_source(source: Arc<dyn ScrapeSource>) {
    SCRAPE_SOURCES
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(source);
}

/// `body` with every scrape source's series after it, as a Prometheus text response
/// (the public `/metrics` and the admin API's `/admin/metrics` both answer with it).
pub fn prometheus_response(mut body: String) -> Response {
    if !body.is_empty() && !body.ends_with('\n') {
        body.push('\n');
    }
    for source in SCRAPE_SOURCES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        source.render(&mut body);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
