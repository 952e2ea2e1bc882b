//! Browsers: only the origins the operator allows may use the API.
//!
//! The public API needs no key, so any web page a user opens could post to a
//! server on their machine (a `no-cors` fetch of a JSON blob needs no
//! preflight). A browser marks every such request with `Origin`; clients
//! that are not browsers send none. A request carrying an `Origin` that
//! `--allow-origin` does not name is refused with 403 before anything else
//! reads it. An allowed origin gets CORS headers, and its preflight
//! (`OPTIONS` with `Access-Control-Request-Method`) is answered here.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::{self, BoxFuture, Either, FutureExt, Ready};
use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN,
    VARY,
};
use http::{HeaderValue, Method, StatusCode};
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::Inner;

/// What a preflight may ask for when no headers are named.
const DEFAULT_ALLOWED_HEADERS: &str = "authorization, content-type, x-request-id";

/// Refuses browser requests from origins not in the list; `*` in the list
/// allows every origin (the operator's explicit choice).
#[derive(Debug, Clone, Default)]
pub struct OriginLayer {
    allowed: Arc<[String]>,
}

impl OriginLayer {
    /// Allows exactly `origins` (`scheme://host[:port]`, as browsers send them).
    pub fn new(origins: &[String]) -> Self {
        let allowed: Vec<String> = origins
            .iter()
            .map(|origin| origin.trim_end_matches('/').to_owned())
            .collect();
        OriginLayer {
            allowed: allowed.into(),
        }
    }
}

impl<S> Layer<S> for OriginLayer {
    type Service = Origin<S>;

    fn layer(&self, inner: S) -> Origin<S> {
        Origin {
            inner,
            allowed: Arc::clone(&self.allowed),
        }
    }
}

/// The service of [`OriginLayer`].
#[derive(Debug, Clone)]
pub struct Origin<S> {
    inner: S,
    allowed: Arc<[String]>,
}

type Reply = Ready<Result<Response, Infallible>>;

impl<S: Inner> Service<Request> for Origin<S> {
    type Response = Response;
    type Error = Infallible;
    type Future =
        Either<S::Future, Either<Reply, BoxFuture<'static, Result<Response, Infallible>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // Not a browser (or a same-origin GET, which sends none): nothing to decide.
        let Some(origin) = request.headers().get(ORIGIN).cloned() else {
            return Either::Left(self.inner.call(request));
        };
        if !self.allows(&origin) {
            let shown = String::from_utf8_lossy(origin.as_bytes());
            let shown: String = shown
                .chars()
                .filter(|c| !c.is_control())
                .take(100)
                .collect();
            let refusal = ApiError::OriginNotAllowed { origin: shown }.into_response();
            return Either::Right(Either::Left(future::ready(Ok(refusal))));
        }
        if is_preflight(&request) {
            let reply = preflight(&request, origin);
            return Either::Right(Either::Left(future::ready(Ok(reply))));
        }
        let answer = self.inner.call(request).map(move |response| {
            response.map(|mut response| {
                allow(response.headers_mut(), origin);
                response
            })
        });
        Either::Right(Either::Right(answer.boxed()))
    }
}

impl<S> Origin<S> {
    fn allows(&self, origin: &HeaderValue) -> bool {
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        self.allowed
            .iter()
            .any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(origin))
    }
}

fn is_preflight(request: &Request) -> bool {
    request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The answer to an allowed origin's preflight: the methods the API serves and
/// the headers asked for.
fn preflight(request: &Request, origin: HeaderValue) -> Response {
    let headers = request
        .headers()
        .get(ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or(HeaderValue::from_static(DEFAULT_ALLOWED_HEADERS));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    let out = response.headers_mut();
    allow(out, origin);
    out.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    out.insert(ACCESS_CONTROL_ALLOW_HEADERS, headers);
    out.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}

fn allow(headers: &mut http::HeaderMap, origin: HeaderValue) {
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    // The answer depends on the origin: caches must not hand it to another.
    headers.append(VARY, HeaderValue::from_static("origin"));
}
