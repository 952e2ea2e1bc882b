//! The middleware in front of the inference handlers: authenticate, route, hand over a
//! [`RoutedRequest`] and the parsed body, and say on the response which checkpoint
//! answered and why.
//!
//! A tower [`Layer`] written out rather than `axum::middleware::from_fn`: a `from_fn`
//! middleware boxes its inner service again for every request (`Next`) and runs its
//! extractors; this service calls the handler it wraps directly, and its only allocation
//! of its own is the routed request's future.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::{BoxFuture, Either};
use http::request::Parts;
use http::{HeaderName, HeaderValue};
use switchyard_policies::{HEADER_COST, HEADER_MODEL, HEADER_ROUTE, HEADER_VERSION};
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::layers::json_body::read_error;
use crate::layers::request_id::request_id;
use crate::layers::Inner;
use crate::openai::extract::{parse_json_object, try_parse_json_object, BodyLimit};
use crate::policy::body::{ParsedBody, RoutableBody};
use crate::policy::request::{
    route_request as build_route_request, RawFields, RequestProblem, RoutingFields,
};
use crate::policy::routed::{RouteSummary, RoutedRequest};
use crate::policy::routing::PolicyRouting;

/// The policy layer for an inference route whose body is a `B`. With no policy (`None`)
/// every request gets a pass-through [`RoutedRequest`] and the handler reads the body;
/// with one, the body is parsed once (and handed to the handler as a [`ParsedBody`]), the
/// request is routed (or refused with an OpenAI-shaped error naming what failed) before
/// its handler runs, and the response says which checkpoint answered and why.
pub struct PolicyLayer<B> {
    routing: Option<Arc<PolicyRouting>>,
    body: PhantomData<fn() -> B>,
}

impl<B> PolicyLayer<B> {
    /// The layer routing through `routing` (`None`: pass-through).
    pub fn new(routing: Option<Arc<PolicyRouting>>) -> Self {
        PolicyLayer {
            routing,
            body: PhantomData,
        }
    }
}

impl<B> Clone for PolicyLayer<B> {
    fn clone(&self) -> Self {
        PolicyLayer::new(self.routing.clone())
    }
}

impl<S, B> Layer<S> for PolicyLayer<B> {
    type Service = PolicyService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            routing: self.routing.clone(),
            body: PhantomData,
        }
    }
}

/// The service [`PolicyLayer`] makes of a handler `S`.
pub struct PolicyService<S, B> {
    inner: S,
    routing: Option<Arc<PolicyRouting>>,
    body: PhantomData<fn() -> B>,
}

impl<S: Clone, B> Clone for PolicyService<S, B> {
    fn clone(&self) -> Self {
        PolicyService {
            inner: self.inner.clone(),
            routing: self.routing.clone(),
            body: PhantomData,
        }
    }
}

impl<S: Inner, B: RoutableBody> Service<Request> for PolicyService<S, B> {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let Some(routing) = &self.routing else {
            request
                .extensions_mut()
                .insert(RoutedRequest::passthrough());
            return Either::Left(self.inner.call(request));
        };
        // The handler is called after the body is read: take the instance made ready
        // and leave a clone in its place (tower's rule for services called later).
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        let (parts, body) = request.into_parts();
        let fut = route_then_call::<S, B>(Arc::clone(routing), parts, body, inner);
        Either::Right(Box::pin(fut))
    }
}

/// Reads and parses the body, routes, calls the handler `inner` with the routed request
/// and decorates its response (or answers with the reason the request was refused).
///
/// Only what crosses an `.await` lives in this future; the routing between the two runs
/// in [`route_parts`], so the boxed future stays small enough for the allocator's
/// per-thread cache (glibc's takes blocks up to about 1 KB).
async fn route_then_call<S, B>(
    routing: Arc<PolicyRouting>,
    mut parts: Parts,
    body: Body,
    mut inner: S,
) -> Result<Response, Infallible>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    B: RoutableBody,
{
    let limit = parts
        .extensions
        .get::<BodyLimit>()
        .map_or(usize::MAX, |limit| limit.0);
    let bytes = match read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => return Ok(error.into_response()),
    };
    let routed = match route_parts::<B>(routing, &mut parts, &bytes) {
        Ok(routed) => routed,
        Err(refusal) => return Ok(refusal),
    };
    let mut response = inner
        .call(Request::from_parts(parts, Body::from(bytes)))
        .await?;
    routed.with_summary(|summary| decorate(&mut response, summary));
    Ok(response)
}

/// Parses `bytes` as a `B`, routes the request and leaves the [`RoutedRequest`] and the
/// [`ParsedBody`] in its extensions; the response that refuses it otherwise.
// The refusal is the response itself, written once into the caller's frame; boxing it
// would add an allocation to every refused request for nothing.
#[allow(clippy::result_large_err)]
fn route_parts<B: RoutableBody>(
    routing: Arc<PolicyRouting>,
    parts: &mut Parts,
    bytes: &Bytes,
) -> Result<RoutedRequest, Response> {
    let (fields, parsed) = match try_parse_json_object::<B>(bytes) {
        Some(parsed) => (parsed.routing_fields(), Some(parsed)),
        // The handler parses again and names the field at fault, after routing, as
        // it would without a policy; routing reads what it needs leniently.
        None => match parse_json_object::<RawFields>(bytes) {
            Ok(raw) => (RoutingFields::from(raw), None),
            Err(error) => return Err(error.into_response()),
        },
    };
    let id = request_id(&parts.headers);
    let route_request = match build_route_request(&routing, &parts.headers, &id, fields) {
        Ok(request) => request,
        Err(RequestProblem::Api(error)) => return Err(error.into_response()),
        Err(RequestProblem::Policy(rejection)) => return Err(rejection.into_response()),
    };
    let route = match routing.route(&route_request) {
        Ok(route) => route,
        Err(error) => return Err(crate::policy::PolicyRejection::Route(error).into_response()),
    };
    let routed = RoutedRequest::routed(routing, route_request, route);
    parts.extensions.insert(routed.clone());
    if let Some(parsed) = parsed {
        parts.extensions.insert(ParsedBody(parsed));
    }
    Ok(routed)
}

/// Reads the whole body, with the same errors as the JSON extractor.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|error| read_error(error, limit))
}

/// Adds `x-switchyard-model`, `-version`, `-route` and `-cost`.
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
}

// Names checked once, at compile time: `HeaderName::from_static` at run time validates
// the name byte by byte on every response.
const MODEL: HeaderName = HeaderName::from_static(HEADER_MODEL);
const VERSION: HeaderName = HeaderName::from_static(HEADER_VERSION);
const ROUTE: HeaderName = HeaderName::from_static(HEADER_ROUTE);
const COST: HeaderName = HeaderName::from_static(HEADER_COST);

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
