//! The routing policy through the admin API: show, reload, reset a rollback rule.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};
use switchyard_policies::{Policy, PolicyError, PolicyStore, RollbackRule, Split};

use crate::admin::{AdminApiError, AdminState};

/// `GET /admin/policy`: the active policy's summary, its generation and the last
/// reload error (cleared by the next good reload).
pub(crate) async fn show(State(state): State<AdminState>) -> Response {
    match state.policy() {
        Ok(store) => Json(summary(store)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `POST /admin/policy/reload`: with an empty body, re-reads the policy file; with a
/// TOML body, installs that. Either way the new policy is validated whole and swapped in
/// atomically, or the old one stays and the answer lists every problem with its line
/// and column (422).
pub(crate) async fn reload(State(state): State<AdminState>, body: Bytes) -> Response {
    let store = match state.policy() {
        Ok(store) => std::sync::Arc::clone(store),
        Err(error) => return error.into_response(),
    };
    // Reading and validating a file is blocking work.
    let result = tokio::task::spawn_blocking(move || {
        let result = if body.iter().all(u8::is_ascii_whitespace) {
            store.reload_from_file()
        } else {
            match std::str::from_utf8(&body) {
                Ok(text) => store.reload_from_str(text, "admin-request"),
                Err(error) => {
                    return Err(AdminApiError::ReloadFailed {
                        message: format!("The request body is not UTF-8 text ({error}); send the policy as TOML, or an empty body to re-read the policy file."),
                        status: StatusCode::BAD_REQUEST,
                    })
                }
            }
        };
        match result {
            Ok(_) => Ok(summary(&store)),
            Err(error) => Err(reload_error(error)),
        }
    })
    .await;
    match result {
        Ok(Ok(summary)) => Json(summary).into_response(),
        Ok(Err(error)) => error.into_response(),
        Err(error) => AdminApiError::Task(error.to_string()).into_response(),
    }
}

/// `POST /admin/policy/splits/{split}/reset`: returns a tripped rollback rule to
/// watching, so the split's weights apply again.
pub(crate) async fn reset_split(
    State(state): State<AdminState>,
    Path(split): Path<String>,
) -> Response {
    let store = match state.policy() {
        Ok(store) => store,
        Err(error) => return error.into_response(),
    };
    if store.current().reset_rollback(&split) {
        tracing::info!(%split, "admin: rollback rule reset");
        Json(summary(store)).into_response()
    } else {
        AdminApiError::UnknownSplit { split }.into_response()
    }
}

fn reload_error(error: PolicyError) -> AdminApiError {
    match error {
        PolicyError::Invalid {
            ref diagnostics, ..
        } => AdminApiError::InvalidPolicy {
            diagnostics: diagnostics.clone(),
            message: format!("{error}\nThe previous policy is still in force."),
        },
        PolicyError::NoFile => AdminApiError::ReloadFailed {
            message: format!("{error}; or send the policy TOML as the request body"),
            status: StatusCode::CONFLICT,
        },
        other => AdminApiError::ReloadFailed {
            message: format!("{other}; the previous policy is still in force"),
            status: StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

/// What `GET /admin/policy` shows.
pub(crate) fn summary(store: &PolicyStore) -> Value {
    let policy = store.current();
    json!({
        "source": policy.source_name(),
        "file": store.path().map(|p| p.display().to_string()),
        "generation": store.generation(),
        "last_reload_error": store.last_error(),
        "routing": policy.routing(),
        "models": models(&policy),
        "tenants": policy.tenants().iter().map(|t| json!({
            "name": &*t.name,
            "budgets": policy.budgets(&t.name).unwrap_or_default()
                .iter().map(|b| b.snapshot()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "splits": policy.splits().iter().map(|s| json!({
            "name": &*s.name,
            "model": policy.models().get(s.model).map(|m| &*m.name),
            "sticky": s.sticky,
            "arms": s.arms.iter().map(|a| json!({
                "name": &*a.name,
                "target": target(&policy, a.model, a.version),
                "weight": a.weight,
            })).collect::<Vec<_>>(),
            "rollback": s.rollback().map(|r| rollback_rule(s, r)),
        })).collect::<Vec<_>>(),
        "rollback": policy.rollback_status(),
        // Client scores (`POST /v1/feedback`) and answer confidence, per checkpoint and
        // split arm: the arms' quality, beside their errors and latency.
        "quality_signals": store.feedback().signals(),
    })
}

/// A split's rollback rule as the file gave it (arms by name).
fn rollback_rule(split: &Split, rule: &RollbackRule) -> Value {
    let arm = |i: usize| split.arms.get(i).map(|a| &*a.name);
    json!({
        "baseline": arm(rule.baseline),
        "candidate": arm(rule.candidate),
        "window_secs": rule.window.as_secs(),
        "min_samples": rule.min_samples,
        "max_error_rate_increase": rule.max_error_rate_increase,
        "max_latency_ratio": rule.max_latency_ratio,
        "max_confidence_drop": rule.max_confidence_drop,
        "max_feedback_drop": rule.max_feedback_drop,
        "eval_suite": rule.eval.as_ref().map(|e| &e.suite),
        "max_eval_drop": rule.eval.as_ref().map(|e| e.max_drop),
    })
}

fn models(policy: &Policy) -> Vec<Value> {
    policy
        .models()
        .iter()
        .map(|m| {
            json!({
                "name": &*m.name,
                "versions": m.versions.iter().map(|v| &**v).collect::<Vec<_>>(),
                "active_version": m.versions.get(m.active_version).map(|v| &**v),
                "aliases": m.aliases.iter().map(|a| &**a).collect::<Vec<_>>(),
                "quality": m.quality,
                // Where a `quality_from` figure came from (measured, or why not).
                "quality_from": m.quality_from.as_ref().map(|f| &f.origins),
                "cost_per_1k_input": m.cost_per_1k_input,
                "cost_per_1k_output": m.cost_per_1k_output,
                "context_limit": m.context_limit,
            })
        })
        .collect()
}

fn target(policy: &Policy, model: usize, version: usize) -> Option<String> {
    let m = policy.models().get(model)?;
    Some(format!("{}@{}", m.name, m.versions.get(version)?))
}
