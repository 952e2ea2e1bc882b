//! Failures of the policy layer, and what each tells the client.
//!
//! Routing errors come from [`switchyard_policies::RouteError`]; this module picks the
//! HTTP status, `code` and `param` of each and converts it into the router's one
//! [`ErrorReply`], which makes the response.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use switchyard_policies::{ConstraintFailure, HintError, RateDecision, RouteError, RouteErrorKind};

use crate::error::ErrorReply;

/// Why the policy layer refused a request before its handler ran.
#[derive(Debug, thiserror::Error)]
pub enum PolicyRejection {
    /// `Authorization` is present but not `Bearer <key>`.
    #[error("The Authorization header must be `Bearer <API key>`; got a header with another scheme or no key.")]
    MalformedAuthorization,
    /// An `x-switchyard-*` hint header could not be used.
    #[error("{source}")]
    Hint {
        /// The header's problem, naming the header and an example value.
        source: HintError,
        /// The header name.
        header: String,
    },
    /// A hint header's value is not visible ASCII.
    #[error("header {header}: the value is not plain ASCII text; send a number or a comma-separated list")]
    HintNotText {
        /// The header name.
        header: String,
    },
    /// The policy could not route the request.
    #[error("{0}")]
    Route(#[from] RouteError),
    /// The tenant or its key is past a requests- or tokens-per-minute limit.
    #[error("{}", rate_limited_message(decision, *tokens))]
    RateLimited {
        /// The limits as they stand (nothing was counted for this request).
        decision: RateDecision,
        /// Tokens the request would have counted.
        tokens: u64,
    },
    /// A handler behind the policy layer ran without a routed request: the app was
    /// assembled without [`crate::policy::PolicyLayer`]. Fails closed.
    #[error("This request was not routed by the policy layer, so it cannot be served; this is a server configuration bug, please report it.")]
    NotRouted,
    /// The policy layer ran without a body read before it: the app was assembled
    /// without [`crate::layers::json_body::JsonBodyLayer`]. Fails closed.
    #[error("This request's body was not read before routing, so it cannot be served; this is a server configuration bug, please report it.")]
    BodyNotRead,
}

impl PolicyRejection {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            PolicyRejection::MalformedAuthorization => StatusCode::UNAUTHORIZED,
            PolicyRejection::Hint { .. } | PolicyRejection::HintNotText { .. } => {
                StatusCode::BAD_REQUEST
            }
            PolicyRejection::Route(error) => route_status(error),
            PolicyRejection::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            PolicyRejection::NotRouted | PolicyRejection::BodyNotRead => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    fn code(&self) -> &'static str {
        match self {
            PolicyRejection::MalformedAuthorization => "invalid_api_key",
            PolicyRejection::Hint { .. } | PolicyRejection::HintNotText { .. } => "invalid_value",
            PolicyRejection::NotRouted | PolicyRejection::BodyNotRead => "not_routed",
            PolicyRejection::RateLimited { .. } => "rate_limit_exceeded",
            PolicyRejection::Route(error) => match error.kind() {
                RouteErrorKind::Unauthenticated => "invalid_api_key",
                RouteErrorKind::UnknownModel => "model_not_found",
                RouteErrorKind::BudgetExhausted => "budget_exhausted",
                RouteErrorKind::Unavailable => "no_checkpoint_available",
                RouteErrorKind::Unsatisfiable if all_forbidden(error) => "model_not_permitted",
                RouteErrorKind::Unsatisfiable => "no_candidate",
                RouteErrorKind::LedgerUnavailable => "budget_unavailable",
            },
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            PolicyRejection::Hint { header, .. } | PolicyRejection::HintNotText { header } => {
                Some(header.clone())
            }
            PolicyRejection::Route(error) if error.kind() == RouteErrorKind::UnknownModel => {
                Some("model".to_owned())
            }
            _ => None,
        }
    }

    /// The reply the client gets.
    pub fn reply(&self) -> ErrorReply {
        let reply =
            ErrorReply::new(self.status(), self.message(), self.code()).with_param(self.param());
        if let PolicyRejection::RateLimited { decision, .. } = self {
            // Throttled, not spent: retrying after the window moves on helps.
            return reply.with_retry_after(Some(decision.retry_after));
        }
        match self.status() {
            // Spent, not throttled: retrying soon does not help.
            StatusCode::TOO_MANY_REQUESTS => reply.with_type("insufficient_quota"),
            // The spend ledger is down: a retry soon may find it back.
            _ if matches!(
                self,
                PolicyRejection::Route(RouteError::LedgerUnavailable { .. })
            ) =>
            {
                reply.with_retry_after(Some(LEDGER_RETRY_AFTER))
            }
            _ => reply,
        }
    }

    fn message(&self) -> String {
        match self {
            PolicyRejection::Route(error) if error.kind() == RouteErrorKind::BudgetExhausted => {
                format!("Budget exhausted: {error}. The budget refills as its window moves on; retry later or ask an operator to raise it.")
            }
            other => other.to_string(),
        }
    }
}

/// `Rate limit reached for requests per minute: limit 3, remaining 0; retry in 37 s.`
fn rate_limited_message(decision: &RateDecision, tokens: u64) -> String {
    let what = match (decision.requests, decision.tokens) {
        (Some(q), _) if q.remaining == 0 => {
            format!("requests per minute: limit {}, remaining 0", q.limit)
        }
        (_, Some(q)) => format!(
            "tokens per minute: limit {}, remaining {}, requested {tokens}",
            q.limit, q.remaining
        ),
        _ => "requests per minute".to_owned(),
    };
    let wait = decision.retry_after.as_secs() + u64::from(decision.retry_after.subsec_nanos() > 0);
    format!("Rate limit reached for {what}; retry in {} s.", wait.max(1))
}

/// 401 unauthenticated, 403 when every candidate is forbidden to the tenant, 429 when
/// every candidate is over budget, 404 unknown model, 503 all overloaded or failing,
/// 400 for the rest (hints no candidate can meet).
fn route_status(error: &RouteError) -> StatusCode {
    match error.kind() {
        RouteErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        RouteErrorKind::UnknownModel => StatusCode::NOT_FOUND,
        RouteErrorKind::BudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
        RouteErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        RouteErrorKind::Unsatisfiable if all_forbidden(error) => StatusCode::FORBIDDEN,
        RouteErrorKind::Unsatisfiable => StatusCode::BAD_REQUEST,
        RouteErrorKind::LedgerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// How long a client refused because the spend ledger is down should wait.
const LEDGER_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

fn all_forbidden(error: &RouteError) -> bool {
    match error {
        RouteError::NoCandidate { rejections, .. } => {
            !rejections.is_empty()
                && rejections.iter().all(|r| {
                    r.failures
                        .iter()
                        .any(|f| matches!(f, ConstraintFailure::NotPermitted { .. }))
                })
        }
        _ => false,
    }
}

impl From<PolicyRejection> for crate::error::ApiError {
    fn from(rejection: PolicyRejection) -> Self {
        crate::error::ApiError::Refused(Box::new(rejection.reply()))
    }
}

impl From<PolicyRejection> for ErrorReply {
    fn from(rejection: PolicyRejection) -> Self {
        rejection.reply()
    }
}

impl IntoResponse for PolicyRejection {
    fn into_response(self) -> Response {
        self.reply().into_response()
    }
}
