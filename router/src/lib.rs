//! Switchyard's HTTP layer: the OpenAI-compatible API over an
//! [`InferenceBackend`](switchyard_seam::InferenceBackend), with request ids, tracing, timeouts, body limits,
//! load shedding and Prometheus metrics.
//!
//! The router never touches the engine directly: it parses and validates
//! OpenAI requests, fans `n` and multi-prompt requests out into
//! [`GenerationRequest`](switchyard_seam::GenerationRequest)s, and turns the engine's token streams into
//! whole JSON bodies or SSE chunks.
//!
//! ```
//! use std::sync::Arc;
//! use switchyard_router::{app, AppState, RouterConfig};
//! use switchyard_router::fake::FakeBackend;
//!
//! # async fn demo() -> std::io::Result<()> {
//! let state = AppState::new(Arc::new(FakeBackend::default()), RouterConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! switchyard_router::serve(listener, app(state), switchyard_router::shutdown_signal()).await
//! # }
//! ```

pub mod admin;
pub mod drain;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod health;
pub mod layers;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod serve;
pub mod state;
pub mod write_timeout;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, post_service};
use tower::{Layer, ServiceBuilder};
use tower_http::trace::TraceLayer;

/// The app type [`app`] and [`app_with_policy`] return, for callers without axum.
pub use axum::Router;
pub use error::ApiError;
pub use serve::{
    serve, serve_with, serve_with_drain_deadline, shutdown_signal, ServeOptions,
    DEFAULT_DRAIN_DEADLINE,
};
pub use state::{AppState, RouterConfig};

use crate::error::ApiError as Error;
use crate::layers::request_id::{
    propagate_request_id_layer, set_request_id_layer, SanitizeRequestIdLayer, REQUEST_ID_HEADER,
};

/// The whole HTTP app for `state`.
///
/// Inference routes (`/v1/chat/completions`, `/v1/completions`) sit behind
/// the timeout and admission control; probes, model listing and metrics do
/// not, so they answer even when the server is saturated.
pub fn app(state: AppState) -> Router {
    app_with_policy(state, None)
}

/// The whole HTTP app for `state`, routing inference requests through `policy`
/// (see [`policy`]); `None` serves each request's `model` as sent, like [`app`].
pub fn app_with_policy(state: AppState, policy: Option<Arc<policy::PolicyRouting>>) -> Router {
    let config = state.config().clone();
    // Innermost, per route: each validates its own request type once, for routing and
    // handler, before routing it. Requests are parsed and routed only once admitted, so
    // shedding stays cheap and budgets are not held by requests waiting for a slot.
    // The policy layer wraps each handler directly (not through `route_layer`, which
    // would box the handler once more and clone that box for every request).
    let limits = policy::ParseLimits {
        max_fanout: config.max_fanout,
    };
    let chat = post_service(
        policy::PolicyLayer::<openai::chat::ValidatedChatRequest>::new(policy.clone(), limits)
            .layer(openai::chat::chat_completions.with_state(state.clone())),
    );
    let feedback = post(policy::feedback::feedback).with_state(policy.clone());
    let completions = post_service(
        policy::PolicyLayer::<openai::completions::ValidatedCompletionRequest>::new(
            policy.clone(),
            limits,
        )
        .layer(openai::completions::completions.with_state(state.clone())),
    );
    let embeddings = post_service(
        policy::PolicyLayer::<openai::embeddings::ValidatedEmbeddingRequest>::new(policy, limits)
            .layer(openai::embeddings::embeddings.with_state(state.clone())),
    );
    let inference = Router::new()
        .route("/v1/chat/completions", chat)
        .route("/v1/completions", completions)
        .route("/v1/embeddings", embeddings)
        // The timeout wraps admission, so time spent queued for a slot counts against
        // the deadline. One `route_layer` with both: each `route_layer` call boxes the
        // routes again, and every box is cloned for every request.
        .route_layer(
            ServiceBuilder::new()
                // The body is in memory before the request queues for a slot; this layer
                // is the one that holds the body limit.
                .layer(layers::json_body::JsonBodyLayer::new(
                    config.max_body_bytes,
                    config.body_read_timeout,
                ))
                .layer(layers::timeout::TimeoutLayer::new(config.request_timeout))
                .layer(layers::shed::ShedLayer::new(state.admission().clone())),
        );
    let service = Router::new()
        .route("/v1/models", get(openai::models::list_models))
        .route("/v1/models/{*id}", get(openai::models::retrieve_model))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(public_metrics))
        .route("/v1/feedback", feedback)
        .merge(inference)
        .fallback(route_not_found)
        .with_state(state);
    // `Router::layer` wraps each route after matching, so `MatchedPath` is known to
    // the metrics layer. One call with the whole stack, outermost first: each
    // `Router::layer` call boxes every route once more, and a request clones each box
    // between it and its handler (allocations that grew with the square of the layers).
    service.layer(
        ServiceBuilder::new()
            .layer(SanitizeRequestIdLayer)
            .layer(set_request_id_layer())
            .layer(
                TraceLayer::new_for_http()
                    // The access log: one line per response at `info`
                    // (`--log-level info`), with the span's method, path and id.
                    .on_response(
                        tower_http::trace::DefaultOnResponse::new().level(tracing::Level::INFO),
                    )
                    .make_span_with(|request: &Request| {
                        let request_id = request
                            .headers()
                            .get(&REQUEST_ID_HEADER)
                            .and_then(|value| value.to_str().ok())
                            .unwrap_or_default();
                        tracing::info_span!(
                            "http",
                            method = %request.method(),
                            path = %request.uri().path(),
                            request_id,
                        )
                    }),
            )
            .layer(propagate_request_id_layer())
            .layer(layers::request_metrics::RequestMetricsLayer)
            // Before any handler or body read: a page from a foreign origin gets
            // nothing of the server.
            .layer(layers::origin::OriginLayer::new(&config.allowed_origins)),
    )
}

/// `GET /metrics`: Prometheus text format, without tenant series.
async fn public_metrics(State(state): State<AppState>) -> Response {
    metrics::prometheus_response(state.metrics().render_public())
}

async fn route_not_found(method: Method, request: Request) -> Response {
    Error::RouteNotFound {
        method: method.to_string(),
        path: request.uri().path().to_owned(),
    }
    .into_response()
}
