//! Per-request metrics: count, duration to the end of the body, in flight.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::backend::BackendError;
use crate::error::ApiError;

use crate::layers::guarded_body::guard_response;
use crate::metrics::{HTTP_REQUESTS_IN_FLIGHT, HTTP_REQUESTS_TOTAL, HTTP_REQUEST_DURATION_SECONDS};

/// Response extension a handler sets to label the request's metrics with the
/// model. Handlers set it only once the backend has accepted the model name,
/// so label values come from the served models, not from arbitrary input.
#[derive(Debug, Clone)]
pub struct ModelLabel(pub String);

/// Middleware: records `switchyard_http_*` metrics for every request.
///
/// Must be installed with `Router::layer` so that `MatchedPath` is known;
/// the path label is the route pattern, never the raw URL.
pub async fn record_request(request: Request, next: Next) -> Response {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let in_flight = InFlight::enter();
    let started = Instant::now();
    let response = next.run(request).await;
    let model = response
        .extensions()
        .get::<ModelLabel>()
        .map(|label| label.0.clone())
        .unwrap_or_default();
    let finished = Finished {
        _in_flight: in_flight,
        started,
        path,
        model,
        status: response.status().as_u16().to_string(),
    };
    guard_response(response, finished)
}

/// Holds the in-flight gauge up while alive.
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT).increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT).decrement(1.0);
    }
}

/// Records count and duration when the response body is done.
struct Finished {
    _in_flight: InFlight,
    started: Instant,
    path: String,
    model: String,
    status: String,
}

impl Drop for Finished {
    fn drop(&mut self) {
        let labels = [
            ("path", self.path.clone()),
            ("model", self.model.clone()),
            ("status", self.status.clone()),
        ];
        metrics::counter!(HTTP_REQUESTS_TOTAL, &labels).increment(1);
        metrics::histogram!(HTTP_REQUEST_DURATION_SECONDS, &labels)
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
