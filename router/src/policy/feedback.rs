//! `POST /v1/feedback`: a client scores an answer it got, by the response's `id`
//! (`chatcmpl-…` / `cmpl-…`), authenticated like the request was. The score counts for
//! the checkpoint and split arm that answered (see [`switchyard_policies::feedback`]);
//! `GET /admin/policy` shows the tallies (`quality_signals`), with the answers'
//! confidence measured by the engine beside them.
//!
//! ```text
//! POST /v1/feedback  {"id": "chatcmpl-3f1c…", "score": 1}
//! 200 {"object": "feedback", "id": "chatcmpl-3f1c…", "checkpoint": "smollm2@1", "arm": null, "score": 1.0}
//! ```

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::json;
use switchyard_policies::feedback::{Answer, FeedbackError};
use switchyard_policies::Caller;
use switchyard_seam::TokenConfidence;

use crate::error::ErrorReply;
use crate::policy::error::PolicyRejection;
use crate::policy::request::caller;
use crate::policy::routed::RoutedRequest;
use crate::policy::routing::PolicyRouting;

/// Response id prefixes: the rest is the request id answers are kept by.
const ID_PREFIXES: [&str; 2] = ["chatcmpl-", "cmpl-"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedbackBody {
    id: String,
    score: f64,
}

impl RoutedRequest {
    /// Notes the engine's confidence in the answer (the least sure choice's), for the
    /// quality signals recorded with it.
    pub fn note_confidence(&self, confidence: Option<TokenConfidence>) {
        let Some(ticket) = self.ticket() else { return };
        ticket.lock().summary.confidence = confidence;
    }

    /// Remembers the answer this request got, so that its client may score it.
    pub(crate) fn record_answer(&self) {
        let Some(ticket) = self.ticket() else { return };
        let state = ticket.lock();
        let summary = &state.summary;
        let answer = Answer {
            checkpoint: summary.checkpoint().to_string(),
            split_arm: summary
                .split_arm
                .as_ref()
                .map(|(split, arm)| (split.to_string(), arm.to_string())),
            tenant: summary.tenant.as_ref().map(|t| t.to_string()),
        };
        let confidence = summary.confidence.map(|c| f64::from(c.mean));
        ticket
            .routing
            .store()
            .feedback()
            .answered(&ticket.request_id, answer, confidence);
    }
}

/// The handler. Without a policy nothing is recorded: 404.
pub async fn feedback(
    State(routing): State<Option<Arc<PolicyRouting>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(routing) = routing else {
        return error(
            StatusCode::NOT_FOUND,
            "feedback is recorded for requests a routing policy routed; start the server with --policy".to_owned(),
            "feedback_unavailable",
            None,
        );
    };
    let body: FeedbackBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"id\": \"<response id>\", \"score\": <0..1>}}: {e}"),
                "invalid_request",
                None,
            )
        }
    };
    let tenant = match caller(&routing, &headers) {
        Ok(Caller::Anonymous) if routing.allows_anonymous() => None,
        Ok(Caller::ApiKey(key)) => match routing.store().current().authenticate(&key) {
            Some(tenant) => Some(tenant.name.to_string()),
            None => {
                return PolicyRejection::Route(switchyard_policies::RouteError::UnknownApiKey)
                    .into_response()
            }
        },
        Ok(_) => {
            return PolicyRejection::Route(switchyard_policies::RouteError::MissingApiKey)
                .into_response()
        }
        Err(rejection) => return rejection.into_response(),
    };
    let request_id = ID_PREFIXES
        .iter()
        .find_map(|prefix| body.id.strip_prefix(prefix))
        .unwrap_or(&body.id);
    match routing
        .store()
        .feedback()
        .score(request_id, tenant.as_deref(), body.score)
    {
        Ok(answer) => {
            // The score also counts for the split's rollback rule, if one watches the arm.
            if let Some((split, arm)) = &answer.split_arm {
                routing
                    .store()
                    .current()
                    .record_arm_feedback(split, arm, body.score);
            }
            Json(json!({
                "object": "feedback",
                "id": body.id,
                "checkpoint": answer.checkpoint,
                "arm": answer.arm_label(),
                "score": body.score,
            }))
            .into_response()
        }
        Err(e @ FeedbackError::ScoreOutOfRange(_)) => error(
            StatusCode::BAD_REQUEST,
            e.to_string(),
            "invalid_value",
            Some("score"),
        ),
        Err(e @ FeedbackError::UnknownAnswer(_)) => error(
            StatusCode::NOT_FOUND,
            e.to_string(),
            "answer_not_found",
            Some("id"),
        ),
        Err(e @ FeedbackError::AlreadyScored(_)) => error(
            StatusCode::CONFLICT,
            e.to_string(),
            "already_scored",
            Some("id"),
        ),
    }
}

fn error(status: StatusCode, message: String, code: &'static str, param: Option<&str>) -> Response {
    ErrorReply::new(status, message, code)
        .with_param(param.map(str::to_owned))
        .into_response()
}
