//! Bearer-token authentication of the admin API.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::AUTHORIZATION;
use switchyard_policies::{digests_equal, key_digest};

use crate::admin::{AdminApiError, AdminState};

/// How long each wrong token holds the one line that wrong tokens wait in: at most
/// four guesses a second, however many connections make them. Right tokens never wait.
const WRONG_TOKEN_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// The line wrong tokens wait in.
static WRONG_TOKENS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Middleware: lets a request through only with `Authorization: Bearer <admin token>`.
/// The presented token is hashed and the digests compared in constant time; wrong
/// tokens are throttled (see [`WRONG_TOKEN_DELAY`]).
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
        Some(_) => {
            let _turn = WRONG_TOKENS.lock().await;
            tokio::time::sleep(WRONG_TOKEN_DELAY).await;
            AdminApiError::WrongToken.into_response()
        }
    }
}
