//! The middleware in front of the inference handlers: parse the body into the
//! endpoint's validated request, authenticate and route from that one value, hand the
//! handler the [`RoutedRequest`] and the [`Validated`] request, and say on the response
//! which checkpoint answered and why.
//!
//! Parse, then route: a body that does not validate is refused with the OpenAI-shaped
//! 400 naming the field before routing runs, so it reserves no budget and moves no route
//! counter. Credentials are part of routing and are read after the body.
//!
//! A tower [`Layer`] written out rather than `axum::middleware::from_fn`: a `from_fn`
//! middleware boxes its inner service again for every request (`Next`) and runs its
//! extractors; this service calls the handler it wraps directly, and its only allocation
//! of its own is the request's future.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderName, HeaderValue};
use switchyard_policies::{
    RateDecision, HEADER_CASCADE, HEADER_CONFIDENCE, HEADER_COST, HEADER_HANDOFF, HEADER_MODEL,
    HEADER_ROUTE, HEADER_VERSION,
};
use switchyard_seam::BackendError;
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::json_body::JsonBytes;
use crate::layers::request_id::request_id;
use crate::layers::Inner;
use crate::policy::error::PolicyRejection;
use crate::policy::rate_limit;
use crate::policy::request::route_request as build_route_request;
use crate::policy::routable::{ParseLimits, RoutableRequest, Validated};
use crate::policy::routed::{RouteSummary, RoutedRequest};
use crate::policy::routing::PolicyRouting;

/// The policy layer for an inference route whose validated request is an `R`. Every
/// request's body is parsed into an `R` first (refused with the field at fault
/// otherwise); with a policy the request is then routed (or refused with an
/// OpenAI-shaped error naming what failed) and the response says which checkpoint
/// answered and why; with none (`None`) it gets a pass-through [`RoutedRequest`].
pub struct PolicyLayer<R> {
    routing: Option<Arc<PolicyRouting>>,
    limits: ParseLimits,
    request: PhantomData<fn() -> R>,
}

impl<R> PolicyLayer<R> {
    /// The layer routing through `routing` (`None`: pass-through), validating requests
    /// against `limits`.
    pub fn new(routing: Option<Arc<PolicyRouting>>, limits: ParseLimits) -> Self {
        PolicyLayer {
            routing,
            limits,
            request: PhantomData,
        }
    }
}

impl<R> Clone for PolicyLayer<R> {
    fn clone(&self) -> Self {
        PolicyLayer::new(self.routing.clone(), self.limits)
    }
}

impl<S, R> Layer<S> for PolicyLayer<R> {
    type Service = PolicyService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            routing: self.routing.clone(),
            limits: self.limits,
            request: PhantomData,
        }
    }
}

/// The service [`PolicyLayer`] makes of a handler `S`.
pub struct PolicyService<S, R> {
    inner: S,
    routing: Option<Arc<PolicyRouting>>,
    limits: ParseLimits,
    request: PhantomData<fn() -> R>,
}

impl<S: Clone, R> Clone for PolicyService<S, R> {
    fn clone(&self) -> Self {
        PolicyService {
            inner: self.inner.clone(),
            routing: self.routing.clone(),
            limits: self.limits,
            request: PhantomData,
        }
    }
}

impl<S: Inner, R: RoutableRequest> Service<Request> for PolicyService<S, R> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The handler is called after the body is read: take the instance made ready
        // and leave a clone in its place (tower's rule for services called later).
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        let (parts, body) = request.into_parts();
        let fut = parse_route_call::<S, R>(self.routing.clone(), self.limits, parts, body, inner);
        Box::pin(fut)
    }
}

/// Bodies of at most this many bytes are parsed on the async worker that reads them;
/// larger ones on the blocking pool (a 4 MB body takes a fraction of a second).
const INLINE_PARSE_BYTES: usize = 256 * 1024;

/// Reads and validates the body, routes, calls the handler `inner` with the routed and
/// validated request and decorates its response (or answers with the reason the request
/// was refused).
///
/// Only what crosses an `.await` lives in this future; parsing and routing between the
/// two run in [`parse_and_route`], so the boxed future stays small enough for the
/// allocator's per-thread cache (glibc's takes blocks up to about 1 KB).
async fn parse_route_call<S, R>(
    routing: Option<Arc<PolicyRouting>>,
    limits: ParseLimits,
    mut parts: Parts,
    body: Body,
    mut inner: S,
) -> Result<Response, Infallible>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    R: RoutableRequest,
{
    // Read once, by the layer that holds the body limit; without it the app was
    // assembled wrong, and nothing is served.
    drop(body);
    let Some(JsonBytes(bytes)) = parts.extensions.remove::<JsonBytes>() else {
        return Ok(PolicyRejection::BodyNotRead.into_response());
    };
    let parsed = if bytes.len() <= INLINE_PARSE_BYTES {
        parse_and_route::<R>(routing, limits, &mut parts, &bytes)
    } else {
        // Parsing megabytes (70,000 tools, say) takes a worker for most of a second.
        match tokio::task::spawn_blocking(move || {
            let parsed = parse_and_route::<R>(routing, limits, &mut parts, &bytes);
            (parts, parsed)
        })
        .await
        {
            Ok((returned, parsed)) => {
                parts = returned;
                parsed
            }
            Err(failure) => {
                let message = format!("parsing the request failed: {failure}");
                let error = ApiError::backend(BackendError::Internal { message }, "messages");
                return Ok(error.into_response());
            }
        }
    };
    let (routed, rate) = match parsed {
        Ok(routed) => routed,
        Err(refusal) => return Ok(refusal),
    };
    // The handler reads the validated request, not the bytes.
    let mut response = inner
        .call(Request::from_parts(parts, Body::empty()))
        .await?;
    if response.status().is_success() {
        // Its client may score it (`POST /v1/feedback`).
        routed.record_answer();
    }
    routed.with_summary(|summary| decorate(&mut response, summary));
    if let Some(rate) = &rate {
        rate_limit::add_headers(response.headers_mut(), rate);
    }
    Ok(response)
}

/// Validates `bytes` as an `R`, counts it against its tenant's rate limits, then routes
/// it; leaves the [`RoutedRequest`] and the [`Validated`] request in its extensions
/// and returns the rate limits' state for the response's headers (`None`: no limit
/// applies), or returns the response that refuses it.
// The refusal is the response itself, written once into the caller's frame; boxing it
// would add an allocation to every refused request for nothing.
#[allow(clippy::result_large_err)]
fn parse_and_route<R: RoutableRequest>(
    routing: Option<Arc<PolicyRouting>>,
    limits: ParseLimits,
    parts: &mut Parts,
    bytes: &Bytes,
) -> Result<(RoutedRequest, Option<RateDecision>), Response> {
    let request = R::parse(bytes, limits).map_err(IntoResponse::into_response)?;
    let (routed, rate) = match routing {
        None => (RoutedRequest::passthrough(), None),
        Some(routing) => {
            let id = request_id(&parts.headers);
            let fields = request.routing_fields();
            let route_request = build_route_request(&routing, &parts.headers, &id, fields)
                .map_err(IntoResponse::into_response)?;
            let rate = rate_limit::admit(&routing, &route_request).map_err(rate_refusal)?;
            // Under a `[cascade]`, `auto` starts with the cascade's first model; when that
            // cannot take the request (permission, budget), `auto` routes as usual.
            let first = crate::policy::cascade::first_step(&routing, &route_request)
                .and_then(|step| routing.route(&step).ok());
            let cascaded = first.is_some();
            let route = match first {
                Some(route) => route,
                None => routing.route(&route_request).map_err(|error| {
                    let mut refusal = PolicyRejection::Route(error).into_response();
                    if let Some(rate) = &rate {
                        rate_limit::add_headers(refusal.headers_mut(), rate);
                    }
                    refusal
                })?,
            };
            let routed = RoutedRequest::routed(routing, route_request, &id, route);
            if cascaded {
                routed.start_cascade();
            }
            (routed, rate)
        }
    };
    parts.extensions.insert(routed.clone());
    parts.extensions.insert(Validated(request));
    Ok((routed, rate))
}

/// The 429 of a request past a rate limit, with `Retry-After` and the limits' headers.
fn rate_refusal(rejection: PolicyRejection) -> Response {
    let decision = match &rejection {
        PolicyRejection::RateLimited { decision, .. } => Some(*decision),
        _ => None,
    };
    let mut response = rejection.into_response();
    if let Some(decision) = decision {
        rate_limit::add_headers(response.headers_mut(), &decision);
    }
    response
}

/// Adds `x-switchyard-model`, `-version`, `-route` and `-cost` (and `-cascade`,
/// `-handoff` and `-confidence` when known).
fn decorate(response: &mut Response, summary: &RouteSummary) {
    let headers = response.headers_mut();
    // One growth of the map for all four, not one per insert that crosses a boundary.
    headers.reserve(4);
    let values: [(HeaderName, &str); 3] = [
        (MODEL, &summary.model),
        (VERSION, &summary.version),
        (ROUTE, &summary.explanation),
    ];
    for (name, value) in values {
        headers.insert(name, header_text(value));
    }
    // Digits and a point: the formatted string becomes the header's bytes, uncopied.
    let cost = switchyard_policies::fixed(summary.estimated_cost, 6);
    let cost = HeaderValue::from_maybe_shared(Bytes::from(cost))
        .unwrap_or_else(|_| HeaderValue::from_static("?"));
    headers.insert(COST, cost);
    if let Some(cascade) = &summary.cascade {
        headers.insert(CASCADE, header_text(cascade));
    }
    if let Some(handoff) = &summary.handoff {
        headers.insert(HANDOFF, header_text(handoff));
    }
    if let Some(confidence) = &summary.confidence {
        headers.insert(CONFIDENCE, header_text(&confidence.to_string()));
    }
}

// Names checked once, at compile time: `HeaderName::from_static` at run time validates
// the name byte by byte on every response.
const MODEL: HeaderName = HeaderName::from_static(HEADER_MODEL);
const VERSION: HeaderName = HeaderName::from_static(HEADER_VERSION);
const ROUTE: HeaderName = HeaderName::from_static(HEADER_ROUTE);
const COST: HeaderName = HeaderName::from_static(HEADER_COST);
const CASCADE: HeaderName = HeaderName::from_static(HEADER_CASCADE);
const CONFIDENCE: HeaderName = HeaderName::from_static(HEADER_CONFIDENCE);
const HANDOFF: HeaderName = HeaderName::from_static(HEADER_HANDOFF);

/// `value` as a header value; characters a header cannot carry become `?`.
fn header_text(value: &str) -> HeaderValue {
    // Policy names and explanations are almost always plain ASCII: take them as they are
    // (`from_str` checks each byte once).
    if let Ok(value) = HeaderValue::from_str(value) {
        return value;
    }
    let clean: String = value
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderValue::from_str(&clean).unwrap_or_else(|_| HeaderValue::from_static("?"))
}

#[cfg(test)]
mod tests {
    use super::header_text;

    #[test]
    fn header_text_keeps_ascii_and_replaces_what_a_header_cannot_carry() {
        assert_eq!(
            header_text("auto: best utility 0.9 of 3"),
            "auto: best utility 0.9 of 3"
        );
        assert_eq!(header_text("modèle\u{7f}x"), "mod?le?x");
        assert_eq!(header_text("line\nbreak"), "line?break");
    }
}
