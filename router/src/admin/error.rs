//! Admin API failures, and what each tells the client: the status and `code` of each,
//! converted into the router's one [`ErrorReply`], which makes the response.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use switchyard_policies::Diagnostic;

use crate::admin::model_admin::{AdminError, AdminErrorKind};
use crate::error::ErrorReply;

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminApiError {
    /// No `Authorization: Bearer` header.
    #[error("The admin API needs `Authorization: Bearer <admin token>` (the token given to `switchyard serve` with --admin-token or SWITCHYARD_ADMIN_TOKEN).")]
    MissingToken,
    /// A token that is not the admin token.
    #[error("The admin token is wrong; use the token given to `switchyard serve` with --admin-token or SWITCHYARD_ADMIN_TOKEN.")]
    WrongToken,
    /// A wrong token while the line of wrong tokens is full: refused at once.
    #[error("Too many requests with a wrong admin token are waiting; this one is refused at once and its connection closed.")]
    WrongTokenFlood,
    /// The part of the server this endpoint manages was not configured.
    #[error("No {what} is configured on this server; {how}.")]
    NotConfigured {
        /// What is missing.
        what: &'static str,
        /// How to configure it.
        how: &'static str,
    },
    /// No such endpoint.
    #[error("Unknown admin URL: {method} {path}. The admin endpoints are under /admin/policy and /admin/models.")]
    UnknownEndpoint {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// The new policy is invalid; the old one is still in force.
    #[error("{message}")]
    InvalidPolicy {
        /// Every problem as `FILE:LINE:COLUMN: message`, after a summary line.
        message: String,
        /// The problems, for clients that want them structured.
        diagnostics: Vec<Diagnostic>,
    },
    /// The policy could not be reloaded for a reason other than its contents.
    #[error("{message}")]
    ReloadFailed {
        /// What went wrong and what to do.
        message: String,
        /// The status to answer with.
        status: StatusCode,
    },
    /// No split of that name has a rollback rule.
    #[error("The active policy has no split named `{split}` with a rollback rule; GET /admin/policy lists the splits.")]
    UnknownSplit {
        /// As requested.
        split: String,
    },
    /// The model adapter refused or failed.
    #[error("{0}")]
    Model(#[from] AdminError),
    /// A query parameter could not be used.
    #[error("query parameter `{param}`: {message}")]
    BadQuery {
        /// The parameter.
        param: &'static str,
        /// What is wrong and what to send.
        message: String,
    },
    /// A field of a JSON request body is missing or wrong.
    #[error("`{param}`: {message}")]
    BadBody {
        /// The field.
        param: String,
        /// What is wrong and what to send.
        message: String,
    },
    /// The spend ledger could not be read.
    #[error("The spend ledger could not be read: {0}. Retry shortly.")]
    Ledger(String),
    /// A model operation panicked or was cancelled.
    #[error("The model operation did not complete: {0}")]
    Task(String),
}

impl AdminApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            AdminApiError::MissingToken
            | AdminApiError::WrongToken
            | AdminApiError::WrongTokenFlood => StatusCode::UNAUTHORIZED,
            AdminApiError::NotConfigured { .. }
            | AdminApiError::UnknownEndpoint { .. }
            | AdminApiError::UnknownSplit { .. } => StatusCode::NOT_FOUND,
            AdminApiError::InvalidPolicy { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AdminApiError::ReloadFailed { status, .. } => *status,
            AdminApiError::Model(error) => match error.kind {
                AdminErrorKind::NotFound => StatusCode::NOT_FOUND,
                AdminErrorKind::Conflict => StatusCode::CONFLICT,
                AdminErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
                AdminErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            },
            AdminApiError::BadQuery { .. } | AdminApiError::BadBody { .. } => {
                StatusCode::BAD_REQUEST
            }
            AdminApiError::Ledger(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminApiError::Task(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            AdminApiError::MissingToken => "missing_admin_token",
            AdminApiError::WrongToken => "invalid_admin_token",
            AdminApiError::WrongTokenFlood => "too_many_wrong_tokens",
            AdminApiError::NotConfigured { .. } => "not_configured",
            AdminApiError::UnknownEndpoint { .. } => "unknown_url",
            AdminApiError::InvalidPolicy { .. } => "invalid_policy",
            AdminApiError::ReloadFailed { .. } => "reload_failed",
            AdminApiError::UnknownSplit { .. } => "split_not_found",
            AdminApiError::Model(error) => match error.kind {
                AdminErrorKind::NotFound => "not_found",
                AdminErrorKind::Conflict => "conflict",
                AdminErrorKind::Invalid => "invalid_checkpoint",
                AdminErrorKind::Unavailable => "unavailable",
            },
            AdminApiError::BadQuery { .. } | AdminApiError::BadBody { .. } => "invalid_value",
            AdminApiError::Ledger(_) => "ledger_unavailable",
            AdminApiError::Task(_) => "internal_error",
        }
    }
}

impl From<AdminApiError> for ErrorReply {
    fn from(error: AdminApiError) -> Self {
        let reply = ErrorReply::new(error.status(), error.to_string(), error.code()).with_param(
            match &error {
                AdminApiError::BadQuery { param, .. } => Some((*param).to_owned()),
                AdminApiError::BadBody { param, .. } => Some(param.clone()),
                _ => None,
            },
        );
        match error {
            // Diagnostics ride along next to the standard error fields.
            AdminApiError::InvalidPolicy { diagnostics, .. } => {
                match serde_json::to_value(diagnostics) {
                    Ok(diagnostics) => reply.with_diagnostics(diagnostics),
                    Err(_) => reply,
                }
            }
            _ => reply,
        }
    }
}

impl IntoResponse for AdminApiError {
    fn into_response(self) -> Response {
        ErrorReply::from(self).into_response()
    }
}
