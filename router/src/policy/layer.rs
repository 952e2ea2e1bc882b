//! The middleware in front of the inference handlers: authenticate, route, hand over a
//! [`RoutedRequest`] and the parsed body, and say on the response which checkpoint
//! answered and why.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue};
use switchyard_policies::{HEADER_COST, HEADER_MODEL, HEADER_ROUTE, HEADER_VERSION};

use crate::error::ApiError;
use crate::layers::request_id::request_id;
use crate::openai::extract::{parse_json_object, try_parse_json_object, BodyLimit};
use crate::policy::body::{ParsedBody, RoutableBody};
use crate::policy::request::{
    route_request as build_route_request, RawFields, RequestProblem, RoutingFields,
};
use crate::policy::routed::{RouteSummary, RoutedRequest};
use crate::policy::routing::PolicyRouting;

/// Middleware for an inference route whose body is a `B`. With no policy (`None`) every
/// request gets a pass-through [`RoutedRequest`] and the handler reads the body; with
/// one, the body is parsed once (and handed to the handler as a [`ParsedBody`]), the
/// request is routed (or refused with an OpenAI-shaped error naming what failed) before
/// its handler runs, and the response says which checkpoint answered and why.
pub async fn route_request<B: RoutableBody>(
    State(routing): State<Option<Arc<PolicyRouting>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(routing) = routing else {
        let mut request = request;
        request
            .extensions_mut()
            .insert(RoutedRequest::passthrough());
        return next.run(request).await;
    };
    let (mut parts, body) = request.into_parts();
    let limit = parts
        .extensions
        .get::<BodyLimit>()
        .map_or(usize::MAX, |limit| limit.0);
    let bytes = match read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_response(),
    };
    let (fields, parsed) = match try_parse_json_object::<B>(&bytes) {
        Some(parsed) => (parsed.routing_fields(), Some(parsed)),
        // The handler parses again and names the field at fault, after routing, as
        // it would without a policy; routing reads what it needs leniently.
        None => match parse_json_object::<RawFields>(&bytes) {
            Ok(raw) => (RoutingFields::from(raw), None),
            Err(error) => return error.into_response(),
        },
    };
    let id = request_id(&parts.headers);
    let route_request = match build_route_request(&routing, &parts.headers, &id, fields) {
        Ok(request) => request,
        Err(RequestProblem::Api(error)) => return error.into_response(),
        Err(RequestProblem::Policy(rejection)) => return rejection.into_response(),
    };
    let route = match routing.route(&route_request) {
        Ok(route) => route,
        Err(error) => return crate::policy::PolicyRejection::Route(error).into_response(),
    };
    let routed = RoutedRequest::routed(Arc::clone(&routing), route_request, route);
    parts.extensions.insert(routed.clone());
    if let Some(parsed) = parsed {
        parts.extensions.insert(ParsedBody(parsed));
    }
    let mut response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    routed.with_summary(|summary| decorate(&mut response, summary));
    response
}

/// Reads the whole body, with the same errors as the JSON extractor.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let inner = error.into_inner();
        let too_large = inner
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
            || std::error::Error::source(inner.as_ref())
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::InvalidJson {
                detail: format!("the body could not be read: {inner}"),
            }
        }
    })
}

/// Adds `x-switchyard-model`, `-version`, `-route` and `-cost`.
fn decorate(response: &mut Response, summary: &RouteSummary) {
    let headers = response.headers_mut();
    // One growth of the map for all four, not one per insert that crosses a boundary.
    headers.reserve(4);
    let cost = switchyard_policies::fixed(summary.estimated_cost, 6);
    let values: [(HeaderName, &str); 4] = [
        (MODEL, &summary.model),
        (VERSION, &summary.version),
        (ROUTE, &summary.explanation),
        (COST, &cost),
    ];
    for (name, value) in values {
        headers.insert(name, header_text(value));
    }
}

// Names checked once, at compile time: `HeaderName::from_static` at run time validates
// the name byte by byte on every response.
const MODEL: HeaderName = HeaderName::from_static(HEADER_MODEL);
const VERSION: HeaderName = HeaderName::from_static(HEADER_VERSION);
const ROUTE: HeaderName = HeaderName::from_static(HEADER_ROUTE);
const COST: HeaderName = HeaderName::from_static(HEADER_COST);

/// `value` as a header value; characters a header cannot carry become `?`.
fn header_text(value: &str) -> HeaderValue {
    // Policy names and explanations are almost always plain ASCII: take them as they are.
    if value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        if let Ok(value) = HeaderValue::from_str(value) {
            return value;
        }
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
