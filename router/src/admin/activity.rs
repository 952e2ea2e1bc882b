//! Recent activity for the console's live charts: `GET /admin/activity`.
//!
//! A sampler records, every [`SAMPLE_EVERY`], the executor's cumulative swap and step
//! counts, its queue and running sequences, and the process's token totals, keeping the
//! last ten minutes of samples (`admin/activity_log.rs`). The counters stay cumulative; the console turns
//! consecutive samples into rates. Sampling on the server, rather than in the page,
//! means a console opened now still shows the minutes before it was opened.

use std::sync::{Arc, Weak};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::admin::activity_log::{take_sample, ActivityLog, SAMPLE_EVERY};
use crate::admin::AdminState;

/// Samples every [`SAMPLE_EVERY`] while the admin state lives (the task holds it only
/// weakly, so it ends once the admin API is dropped). Started by `admin_app` when it is
/// built inside a Tokio runtime.
pub(crate) fn spawn_sampler(state: &AdminState) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let log: Weak<ActivityLog> = Arc::downgrade(state.activity());
    let models = state.models().ok().map(|m| Arc::downgrade(&m));
    runtime.spawn(async move {
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(log) = log.upgrade() else { return };
            let models = models.as_ref().and_then(Weak::upgrade);
            // The adapter's status takes locks: off the async workers.
            let sample = tokio::task::spawn_blocking(move || take_sample(models.as_deref())).await;
            match sample {
                Ok(sample) => log.record(sample),
                Err(error) => tracing::warn!(%error, "admin: activity sample failed"),
            }
        }
    });
}

/// `GET /admin/activity`: the kept samples, oldest first.
pub(crate) async fn show(State(state): State<AdminState>) -> Response {
    Json(json!({
        "interval_ms": SAMPLE_EVERY.as_millis() as u64,
        "samples": state.activity().samples(),
    }))
    .into_response()
}
