//! Bearer-token authentication of the admin API.

use axum::extract::{Request, State};
use axum::middleware::Next;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, CONNECTION};
use http::HeaderValue;
use switchyard_policies::{digests_equal, key_digest};

use crate::admin::{AdminApiError, AdminState};

/// How long each wrong token holds the one line that wrong tokens wait in: at most
/// four guesses a second, however many connections make them. Right tokens never wait.
const WRONG_TOKEN_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// The line wrong tokens wait in.
static WRONG_TOKENS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Wrong tokens that may wait in the line at once (two seconds of it). Beyond, a wrong
/// token is refused at once and its connection closed: 1,100 connections waiting in
/// the line held the server's connection cap, and the right token got 503 for minutes.
const MAX_WRONG_WAITING: usize = 8;

/// Wrong tokens in the line now.
static WRONG_WAITING: AtomicUsize = AtomicUsize::new(0);

/// A place in the line, given back when dropped (the client may leave while waiting).
struct InLine;

impl InLine {
    fn join() -> Option<InLine> {
        WRONG_WAITING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
                (waiting < MAX_WRONG_WAITING).then_some(waiting + 1)
            })
            .ok()
            .map(|_| InLine)
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        WRONG_WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Middleware: lets a request through only with `Authorization: Bearer <admin token>`.
/// The presented token is hashed and the digests compared in constant time; wrong
/// tokens are throttled (see [`WRONG_TOKEN_DELAY`]), and refused at once when the
/// line is full (see [`MAX_WRONG_WAITING`]).
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
            let Some(_place) = InLine::join() else {
                let mut refused = AdminApiError::WrongTokenFlood.into_response();
                refused
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                return refused;
            };
            let _turn = WRONG_TOKENS.lock().await;
            tokio::time::sleep(WRONG_TOKEN_DELAY).await;
            AdminApiError::WrongToken.into_response()
        }
    }
}
