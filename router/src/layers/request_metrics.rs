//! Per-request metrics: count, duration to the end of the body, in flight.

use std::convert::Infallible;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use metrics::{Counter, Gauge, Histogram};
use tower::{Layer, Service};

use crate::error::ApiError;
use switchyard_seam::BackendError;

use crate::layers::guarded_body::guard_response;
use crate::layers::Inner;
use crate::metrics::{
    cached_handles, HandleCache, HTTP_REQUESTS_IN_FLIGHT, HTTP_REQUESTS_TOTAL,
    HTTP_REQUEST_DURATION_SECONDS,
};

/// Response extension a handler sets to label the request's metrics with the
/// model. Handlers set it only once the backend has accepted the model name,
/// so label values come from the served models, not from arbitrary input.
#[derive(Debug, Clone)]
pub struct ModelLabel(pub String);

/// Records `switchyard_http_*` metrics for every request.
///
/// Must be installed with `Router::layer` so that `MatchedPath` is known;
/// the path label is the route pattern, never the raw URL.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestMetricsLayer;

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics { inner }
    }
}

/// The service of [`RequestMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
}

impl<S: Inner> Service<Request> for RequestMetrics<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let path = request.extensions().get::<MatchedPath>().cloned();
        let in_flight = InFlight::enter();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let model = response
                .extensions()
                .get::<ModelLabel>()
                .map_or("", |label| label.0.as_str());
            let path = path.as_ref().map_or("unmatched", MatchedPath::as_str);
            let finished = Finished {
                _in_flight: in_flight,
                started,
                series: Series::of(path, model, response.status().as_u16()),
            };
            Ok(guard_response(response, finished))
        })
    }
}

/// Holds the in-flight gauge up while alive.
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        in_flight_gauge().increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        in_flight_gauge().decrement(1.0);
    }
}

/// The in-flight gauge, looked up in the recorder once (the router installs its
/// recorder before it serves a request).
fn in_flight_gauge() -> &'static Gauge {
    static GAUGE: OnceLock<Gauge> = OnceLock::new();
    GAUGE.get_or_init(|| metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT))
}

/// The count and duration series of one label set.
#[derive(Clone)]
struct Series {
    total: Counter,
    duration: Histogram,
}

impl Series {
    fn of(path: &str, model: &str, status: u16) -> Series {
        thread_local! {
            static BY_LABELS: HandleCache<Series> = HandleCache::default();
        }
        cached_handles(
            &BY_LABELS,
            format_args!("{path}\0{model}\0{status}"),
            || {
                let labels = [
                    ("path", path.to_owned()),
                    ("model", model.to_owned()),
                    ("status", status.to_string()),
                ];
                Series {
                    total: metrics::counter!(HTTP_REQUESTS_TOTAL, &labels),
                    duration: metrics::histogram!(HTTP_REQUEST_DURATION_SECONDS, &labels),
                }
            },
        )
    }
}

/// Records count and duration when the response body is done.
struct Finished {
    _in_flight: InFlight,
    started: Instant,
    series: Series,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.series.total.increment(1);
        self.series
            .duration
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// Turns a handler's outcome into a response labelled with `model` when the
/// backend has accepted the name: on success, or when it failed for a reason
/// other than not knowing the model.
pub fn labelled_response(model: &str, outcome: Result<Response, ApiError>) -> Response {
    let (known, mut response) = match outcome {
        Ok(response) => (true, response),
        Err(error) => {
            let known = matches!(
                &error,
                ApiError::Backend { source, .. }
                    if !matches!(source, BackendError::UnknownModel { .. })
            );
            (known, error.into_response())
        }
    };
    if known {
        response
            .extensions_mut()
            .insert(ModelLabel(model.to_owned()));
    }
    response
}
