//! The admin API, served on its own listener: the routing policy and model lifecycle.
//!
//! Every request needs `Authorization: Bearer <admin token>` (compared in constant
//! time); anything else gets an OpenAI-shaped 401. The one exception is the operator
//! console's page and files (`GET /admin/console`, see [`console`]), which hold no data
//! and call the endpoints below with the token. Endpoints:
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /admin/policy` | the active policy's summary, generation and last reload error |
//! | `POST /admin/policy/reload` | re-read the policy file (empty body) or install the TOML body; validated whole, swapped atomically; invalid: 422 with `FILE:LINE:COLUMN` diagnostics, the old policy kept |
//! | `POST /admin/policy/splits/{split}/reset` | return a tripped rollback rule to watching |
//! | `GET /admin/models`, `GET /admin/status` | [`ModelAdmin::models`], [`ModelAdmin::status`] |
//! | `POST /admin/models/{model}/versions/{version}/load` (`unload`, `activate`) | lifecycle |
//! | `POST /admin/models/{model}/rollback` | back to the previous active version |
//! | `GET /admin/adapters`, `POST /admin/adapters`, `DELETE /admin/adapters/{name}` | LoRA adapters: list with their budget, register at run time (validated against the base), forget |
//! | `GET /admin/activity` | swaps, steps, tokens, queue and batch sampled every 2 s over the last 10 minutes |
//!
//! Parts that were not configured (no policy, no model adapter) answer 404 saying what
//! to configure.

pub mod activity;
pub mod activity_log;
mod adapters;
mod auth;
pub mod console;
mod error;
pub mod model_admin;
pub mod models;
mod policy;
mod state;
mod usage;

use axum::extract::Request;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{middleware, Router};

pub use error::AdminApiError;
pub use model_admin::{AdapterRequest, AdminError, AdminErrorKind, ModelAdmin};
pub use state::AdminState;

/// The admin API's routes, behind bearer-token authentication, and the console's page.
/// Built inside a Tokio runtime, it also starts the activity sampler (see [`activity`]).
pub fn admin_app(state: AdminState) -> Router {
    activity::spawn_sampler(&state);
    let api = Router::new()
        .route("/admin/policy", get(policy::show))
        .route("/admin/policy/reload", post(policy::reload))
        .route(
            "/admin/policy/splits/{split}/reset",
            post(policy::reset_split),
        )
        .route("/admin/models", get(models::list))
        .route("/admin/status", get(models::status))
        .route("/admin/cache", get(models::cache))
        .route("/admin/metrics", get(admin_metrics))
        .route(
            "/admin/models/{model}/versions/{version}/{action}",
            post(models::version_action),
        )
        .route("/admin/models/{model}/rollback", post(models::rollback))
        .route(
            "/admin/adapters",
            get(adapters::list).post(adapters::register),
        )
        .route("/admin/adapters/{name}", delete(adapters::unregister))
        .route("/admin/activity", get(activity::show))
        .route("/admin/usage", get(usage::export))
        .fallback(not_found)
        // `layer`, not `route_layer`: unknown paths need the token too.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state);
    // Merged after the token layer, so only the console's own files skip it.
    console::routes().merge(api)
}

/// `GET /admin/metrics`: every series, tenant spend included (the public `/metrics`
/// leaves those out).
async fn admin_metrics() -> Response {
    crate::metrics::prometheus_response(crate::metrics::Metrics::global().render())
}

async fn not_found(method: Method, request: Request) -> Response {
    AdminApiError::UnknownEndpoint {
        method: method.to_string(),
        path: request.uri().path().to_owned(),
    }
    .into_response()
}
