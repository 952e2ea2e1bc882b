//! From a validated request and its headers to a [`RouteRequest`]: caller, `model`,
//! hints and size estimates.
//!
//! The size estimates come from the request type ([`RoutingFields`]): prompt tokens are
//! *estimated* from characters, since tokenizing for real would need the checkpoint's
//! tokenizer before the checkpoint is chosen. The estimate only has to be right in
//! magnitude: it drives the context, cost and budget checks of routing; once the
//! checkpoint is chosen, the reservation is resized to the engine's exact count before
//! the generation runs ([`crate::policy::RoutedRequest::cover`]), and budgets are
//! settled with the engine's counts when the request ends.

use http::header::AUTHORIZATION;
use http::HeaderMap;
use switchyard_policies::{stable_hash, Caller, Hints, RouteRequest};

use crate::policy::error::PolicyRejection;
use crate::policy::routable::RoutingFields;
use crate::policy::routing::PolicyRouting;

/// Builds the route request of one HTTP request.
pub(crate) fn route_request(
    routing: &PolicyRouting,
    headers: &HeaderMap,
    request_id: &str,
    fields: RoutingFields,
) -> Result<RouteRequest, PolicyRejection> {
    let caller = caller(routing, headers)?;
    let mut request = RouteRequest::new(fields.model, caller);
    request.hints = hints(headers)?;
    request.user = fields.user;
    request.max_output_tokens = fields.max_output_tokens;
    request.prompt_tokens = fields.prompt_tokens;
    request.generations = fields.generations;
    request.request_id = stable_hash("request", request_id);
    Ok(request)
}

/// The caller from `Authorization: Bearer <key>`.
///
/// A key the policy does not know is refused, unless the policy allows anonymous
/// requests: then keys only pick out tenants, and an unknown key (OpenAI clients always
/// send one) is routed as anonymous.
pub(crate) fn caller(
    routing: &PolicyRouting,
    headers: &HeaderMap,
) -> Result<Caller, PolicyRejection> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(Caller::Anonymous);
    };
    let value = value
        .to_str()
        .map_err(|_| PolicyRejection::MalformedAuthorization)?;
    let (scheme, key) = value
        .trim()
        .split_once(' ')
        .ok_or(PolicyRejection::MalformedAuthorization)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(PolicyRejection::MalformedAuthorization);
    }
    if routing.allows_anonymous() && !routing.knows_key(key) {
        return Ok(Caller::Anonymous);
    }
    Ok(Caller::ApiKey(key.to_owned()))
}

/// Every `x-switchyard-*` hint header.
fn hints(headers: &HeaderMap) -> Result<Hints, PolicyRejection> {
    let mut hints = Hints::default();
    for (name, value) in headers {
        let name = name.as_str();
        if !name.starts_with("x-switchyard-") {
            continue;
        }
        let value = value.to_str().map_err(|_| PolicyRejection::HintNotText {
            header: name.to_owned(),
        })?;
        hints
            .apply_header(name, value)
            .map_err(|source| PolicyRejection::Hint {
                source,
                header: name.to_owned(),
            })?;
    }
    Ok(hints)
}
