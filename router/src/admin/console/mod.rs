//! The operator console: a page on the admin listener that shows the models, the
//! executor's activity and the routing policy, and loads, activates, rolls back and
//! unloads versions through the admin API.
//!
//! The page and its script, style and icon are compiled into the binary and served
//! without the admin token (they hold no data); every data call the page makes sends
//! the token, which the operator enters once and the page keeps in `sessionStorage`
//! (never in a URL or a cookie). A strict Content-Security-Policy allows only these
//! same-origin files and same-origin `fetch`: no inline script or style, no external
//! request, no framing.

use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use http::HeaderValue;

/// Where the console is served.
pub const CONSOLE_PATH: &str = "/admin/console";

/// Allows the console's own files and same-origin API calls, nothing else.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");
const ICON_SVG: &str = include_str!("icon.svg");

/// The console's routes; they need no token (see the module docs).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(CONSOLE_PATH, get(page))
        .route("/admin/console/", get(page))
        .route(
            "/admin/console/console.js",
            get(|| async { asset(CONSOLE_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/admin/console/console.css",
            get(|| async { asset(CONSOLE_CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/admin/console/icon.svg",
            get(|| async { asset(ICON_SVG, "image/svg+xml") }),
        )
}

async fn page() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Revalidate so that a new binary's console replaces the old one at once.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
