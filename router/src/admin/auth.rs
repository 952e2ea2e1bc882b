//! Bearer-token authentication of the admin API.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::AUTHORIZATION;
use switchyard_policies::{digests_equal, key_digest};

use crate::admin::{AdminApiError, AdminState};

/// Middleware: lets a request through only with `Authorization: Bearer <admin token>`.
/// The presented token is hashed and the digests compared in constant time.
pub async fn require_token(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        None => AdminApiError::MissingToken.into_response(),
        Some(token) if digests_equal(&key_digest(token), state.token()) => next.run(request).await,
        Some(_) => AdminApiError::WrongToken.into_response(),
    }
}
