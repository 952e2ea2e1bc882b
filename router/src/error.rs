//! The one place where failures become HTTP responses and SSE error events.
//!
//! Every error type of the router converts into an [`ErrorReply`] — the OpenAI
//! endpoints' [`ApiError`] here, the policy layer's `PolicyRejection`
//! (`policy/error.rs`) and the admin API's `AdminApiError` (`admin/error.rs`) — and
//! only an [`ErrorReply`] is turned into a response or an SSE event, so the body
//! shape, the `type` for each status, `Retry-After` and `WWW-Authenticate` are decided
//! once. Each error type says only its own status, message, `code` and `param`.
//!
//! An [`ApiError`]'s message names the field and the value at fault;
//! [`ApiError::status`], [`ApiError::param`] and [`ApiError::code`] give the rest of
//! OpenAI's error body `{"error": {"message", "type", "param", "code"}}`.

use std::time::Duration;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderValue, StatusCode};
use serde::Serialize;

use switchyard_seam::BackendError;

/// A request failure, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or not a JSON object of the expected shape.
    #[error("We could not parse the JSON body of your request ({detail}). Send a JSON object as described in the OpenAI API reference.")]
    InvalidJson {
        /// The parser's complaint, with line and column.
        detail: String,
    },
    /// A field has the wrong JSON type.
    #[error("Invalid type for '{param}': {detail}.")]
    InvalidType {
        /// The path of the field, e.g. `messages[0].content`.
        param: String,
        /// What was found and what was expected.
        detail: String,
    },
    /// A required field is absent or null.
    #[error("Missing required parameter: '{param}'.")]
    MissingParameter {
        /// The missing field.
        param: String,
    },
    /// A field has the right type but a value outside what is allowed.
    #[error("Invalid value for '{param}': {message}")]
    InvalidValue {
        /// The path of the field.
        param: String,
        /// The value given and what is allowed.
        message: String,
    },
    /// A field asks for something this server does not do.
    #[error("Unsupported parameter '{param}': {message}")]
    Unsupported {
        /// The field.
        param: String,
        /// What is not supported and what to send instead.
        message: String,
    },
    /// The body is larger than the configured limit.
    #[error("The request body is larger than the limit of {limit} bytes; send a smaller request.")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body did not arrive within the server's body-read deadline.
    #[error("The request body did not arrive within {} s; send the whole body promptly.", after.as_secs_f64())]
    BodyTimeout {
        /// The deadline.
        after: Duration,
    },
    /// The body is declared as something other than JSON.
    #[error("The request body is declared as '{content_type}'; send JSON with 'Content-Type: application/json'.")]
    UnsupportedMediaType {
        /// The `Content-Type` given (cut short when long).
        content_type: String,
    },
    /// A POST without a `Content-Type` (a browser's `no-cors` blob sends none).
    #[error(
        "The request body has no Content-Type; send JSON with 'Content-Type: application/json'."
    )]
    MissingContentType,
    /// A browser request from a web page whose origin the server does not allow.
    #[error("Requests from the web origin '{origin}' are not allowed; the operator can allow it with --allow-origin.")]
    OriginNotAllowed {
        /// The `Origin` header given (cut short when long).
        origin: String,
    },
    /// The client stopped reading its stream; the generation was cancelled.
    #[error("The client did not read the response for {} s; the generation was cancelled.", after.as_secs_f64())]
    ClientStalled {
        /// The write timeout.
        after: Duration,
    },
    /// The server is shutting down and ended the stream at its drain deadline.
    #[error("The server is shutting down and ended this stream at its drain deadline; retry the request.")]
    ShuttingDown,
    /// Load shedding: every slot is busy and the wait queue is full.
    #[error("The server is at capacity ({in_flight} requests in flight, {queued} waiting); retry after {} s.", retry_after.as_secs().max(1))]
    TooManyRequests {
        /// The in-flight limit.
        in_flight: usize,
        /// The wait-queue limit.
        queued: usize,
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
    /// The request did not finish within the server's deadline.
    #[error("The request did not complete within {} s; retry with a smaller max_tokens or use stream=true.", after.as_secs_f64())]
    Timeout {
        /// The deadline.
        after: Duration,
    },
    /// No route matches the method and path.
    #[error("Unknown request URL: {method} {path}. See the OpenAI API reference for the endpoints served here.")]
    RouteNotFound {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// A later stage of the policy layer refused the request (a budget that cannot
    /// hold the prompt's real size, a spend ledger that cannot be reached), as the
    /// policy layer words it.
    #[error("{}", .0.body().error.message)]
    Refused(Box<ErrorReply>),
    /// The backend refused or failed the generation.
    #[error("{source}")]
    Backend {
        /// What the backend said.
        source: BackendError,
        /// The request field holding the prompt (`messages` or `prompt`), named
        /// when the prompt does not fit the context.
        prompt_field: &'static str,
    },
}

/// OpenAI's error body: `{"error": {...}}`.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The inner object of OpenAI's error body.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorDetail {
    /// What went wrong and what to do.
    pub message: String,
    /// A stable category such as `invalid_request_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A stable machine-readable code, if any.
    pub code: Option<&'static str>,
    /// Structured details beside the message (the admin API's policy diagnostics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<serde_json::Value>,
}

/// A failure of any stage, as the client is told it: the one value that becomes an HTTP
/// error response ([`IntoResponse`]) or an SSE error event ([`ErrorReply::sse_event`]).
#[derive(Debug, Clone)]
pub struct ErrorReply {
    status: StatusCode,
    body: ErrorBody,
    retry_after: Option<Duration>,
}

impl ErrorReply {
    /// A reply with `status`, `message` and `code`; OpenAI's `type` follows from the
    /// status ([`error_type`]), no `param`, no `Retry-After`.
    pub fn new(status: StatusCode, message: String, code: &'static str) -> Self {
        ErrorReply {
            status,
            body: ErrorBody {
                error: ErrorDetail {
                    message,
                    kind: error_type(status),
                    param: None,
                    code: Some(code),
                    diagnostics: None,
                },
            },
            retry_after: None,
        }
    }

    /// Names the request field (or header) at fault.
    pub fn with_param(mut self, param: Option<String>) -> Self {
        self.body.error.param = param;
        self
    }

    /// Replaces the `type` the status implies (a spent budget is `insufficient_quota`,
    /// not a rate limit).
    pub fn with_type(mut self, kind: &'static str) -> Self {
        self.body.error.kind = kind;
        self
    }

    /// Asks the client to wait this long before retrying.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Adds structured details beside the message.
    pub fn with_diagnostics(mut self, diagnostics: serde_json::Value) -> Self {
        self.body.error.diagnostics = Some(diagnostics);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> &ErrorBody {
        &self.body
    }

    /// The body, taken.
    pub fn into_body(self) -> ErrorBody {
        self.body
    }

    /// The error as one SSE `data:` event, for failures after a stream began.
    pub fn sse_event(&self) -> Event {
        sse_json_event(&self.body)
    }
}

/// OpenAI's error `type` for a status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        status if status.is_server_error() => "server_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for ErrorReply {
    fn into_response(self) -> Response {
        let message = &self.body.error.message;
        if self.status.is_server_error() {
            tracing::warn!(error = %message, status = %self.status, "request failed");
        } else {
            tracing::debug!(error = %message, status = %self.status, "request rejected");
        }
        let mut response = (self.status, Json(&self.body)).into_response();
        let headers = response.headers_mut();
        if let Some(retry_after) = self.retry_after {
            // Retry-After is whole seconds; round up so clients never retry early.
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl ApiError {
    /// Wraps a backend error, remembering which field holds the prompt.
    pub fn backend(source: BackendError, prompt_field: &'static str) -> Self {
        ApiError::Backend {
            source,
            prompt_field,
        }
    }

    /// The HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson { .. }
            | ApiError::InvalidType { .. }
            | ApiError::MissingParameter { .. }
            | ApiError::InvalidValue { .. }
            | ApiError::Unsupported { .. } => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType { .. } | ApiError::MissingContentType => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            ApiError::OriginNotAllowed { .. } => StatusCode::FORBIDDEN,
            ApiError::ClientStalled { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::Refused(reply) => reply.status(),
            ApiError::Backend { source, .. } => match source {
                BackendError::UnknownModel { .. } => StatusCode::NOT_FOUND,
                BackendError::ContextOverflow { .. } | BackendError::InvalidRequest { .. } => {
                    StatusCode::BAD_REQUEST
                }
                BackendError::Overloaded | BackendError::Unavailable { .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                BackendError::TenantBusy { .. } => StatusCode::TOO_MANY_REQUESTS,
                BackendError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// The request field at fault, if any.
    pub fn param(&self) -> Option<String> {
        match self {
            ApiError::InvalidType { param, .. }
            | ApiError::MissingParameter { param }
            | ApiError::InvalidValue { param, .. }
            | ApiError::Unsupported { param, .. } => Some(param.clone()),
            ApiError::Refused(reply) => reply.body().error.param.clone(),
            ApiError::Backend {
                source,
                prompt_field,
            } => match source {
                BackendError::UnknownModel { .. } | BackendError::Unavailable { .. } => {
                    Some("model".to_owned())
                }
                BackendError::ContextOverflow {
                    prompt_tokens,
                    context,
                    ..
                } if prompt_tokens < context => Some("max_tokens".to_owned()),
                BackendError::ContextOverflow { .. } => Some((*prompt_field).to_owned()),
                BackendError::InvalidRequest { param, .. } => Some(param.clone()),
                BackendError::Overloaded
                | BackendError::TenantBusy { .. }
                | BackendError::Internal { .. } => None,
            },
            ApiError::InvalidJson { .. }
            | ApiError::PayloadTooLarge { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::UnsupportedMediaType { .. }
            | ApiError::MissingContentType
            | ApiError::OriginNotAllowed { .. }
            | ApiError::ClientStalled { .. }
            | ApiError::ShuttingDown
            | ApiError::TooManyRequests { .. }
            | ApiError::Timeout { .. }
            | ApiError::RouteNotFound { .. } => None,
        }
    }

    /// OpenAI's error `code`.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson { .. } => "invalid_json",
            ApiError::InvalidType { .. } => "invalid_type",
            ApiError::MissingParameter { .. } => "missing_required_parameter",
            ApiError::InvalidValue { .. } => "invalid_value",
            ApiError::Unsupported { .. } => "unsupported_parameter",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::BodyTimeout { .. } => "body_timeout",
            ApiError::UnsupportedMediaType { .. } | ApiError::MissingContentType => {
                "unsupported_media_type"
            }
            ApiError::OriginNotAllowed { .. } => "origin_not_allowed",
            ApiError::ClientStalled { .. } => "client_stalled",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::TooManyRequests { .. } => "rate_limit_exceeded",
            ApiError::Timeout { .. } => "timeout",
            ApiError::RouteNotFound { .. } => "unknown_url",
            ApiError::Refused(reply) => reply.body().error.code.unwrap_or("refused"),
            ApiError::Backend { source, .. } => match source {
                BackendError::UnknownModel { .. } => "model_not_found",
                BackendError::ContextOverflow { .. } => "context_length_exceeded",
                BackendError::InvalidRequest { .. } => "invalid_value",
                BackendError::Overloaded => "overloaded",
                BackendError::Unavailable { .. } => "model_not_ready",
                BackendError::TenantBusy { .. } => "tenant_queue_full",
                BackendError::Internal { .. } => "internal_error",
            },
        }
    }

    /// How long the client should wait before retrying, when retrying helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::TooManyRequests { retry_after, .. } => Some(*retry_after),
            ApiError::ShuttingDown => Some(Duration::from_secs(1)),
            ApiError::Backend {
                source: BackendError::Overloaded | BackendError::TenantBusy { .. },
                ..
            } => Some(Duration::from_secs(1)),
            ApiError::Backend {
                source:
                    BackendError::Unavailable {
                        retry_after_secs, ..
                    },
                ..
            } => Some(Duration::from_secs((*retry_after_secs).max(1))),
            ApiError::Refused(reply) => reply.retry_after,
            _ => None,
        }
    }

    /// The reply the client gets.
    pub fn reply(&self) -> ErrorReply {
        if let ApiError::Refused(reply) = self {
            return (**reply).clone();
        }
        ErrorReply::new(self.status(), self.to_string(), self.code())
            .with_param(self.param())
            .with_retry_after(self.retry_after())
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> ErrorBody {
        self.reply().into_body()
    }

    /// The error as one SSE `data:` event, for failures after a stream began.
    pub fn sse_event(&self) -> Event {
        self.reply().sse_event()
    }
}

impl From<ApiError> for ErrorReply {
    fn from(error: ApiError) -> Self {
        error.reply()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.reply().into_response()
    }
}

/// Serializes `value` as the data of one SSE event.
///
/// Serializing the router's own response types cannot fail (no maps with
/// non-string keys, no failing `Serialize` impls); if it ever does, the client
/// gets an error event instead of a broken stream.
pub fn sse_json_event<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(err) => {
            tracing::error!(%err, "could not serialize an SSE event");
            Event::default().data(
                r#"{"error":{"message":"internal error: could not serialize a stream chunk","type":"server_error","param":null,"code":"internal_error"}}"#,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error type's reply goes through one mapping: the `type` follows the status,
    /// 401s carry `WWW-Authenticate` and retryable errors `Retry-After`, whoever made them.
    #[test]
    fn one_mapping_for_status_type_and_headers() {
        let unauthorized = ErrorReply::new(StatusCode::UNAUTHORIZED, "no".to_owned(), "x");
        assert_eq!(unauthorized.body().error.kind, "authentication_error");
        let response = unauthorized.into_response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert!(response.headers().get(header::RETRY_AFTER).is_none());

        let shed = ApiError::TooManyRequests {
            in_flight: 1,
            queued: 1,
            retry_after: Duration::from_millis(1500),
        };
        let reply = shed.reply();
        assert_eq!(reply.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.body().error.kind, "rate_limit_error");
        assert_eq!(reply.body().error.code, Some("rate_limit_exceeded"));
        let response = reply.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert!(response.headers().get(header::WWW_AUTHENTICATE).is_none());

        let invalid = ApiError::InvalidValue {
            param: "n".to_owned(),
            message: "too many".to_owned(),
        };
        let body = serde_json::to_value(invalid.body()).unwrap_or_default();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "Invalid value for 'n': too many",
                "type": "invalid_request_error", "param": "n", "code": "invalid_value"}})
        );
    }

    /// A model not ready yet (an adapter loading) is a 503 naming `model`, with the
    /// engine's Retry-After, not a 400: retrying the same request will work.
    #[test]
    fn a_model_not_ready_is_a_503_with_retry_after() {
        let error = ApiError::backend(
            BackendError::Unavailable {
                message: "`a@1` is loading".to_owned(),
                retry_after_secs: 3,
            },
            "prompt",
        );
        let reply = error.reply();
        assert_eq!(reply.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.body().error.kind, "server_error");
        assert_eq!(reply.body().error.param.as_deref(), Some("model"));
        assert_eq!(reply.body().error.code, Some("model_not_ready"));
        assert!(reply.body().error.message.contains("`a@1` is loading"));
        let response = reply.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    }
}
