//! Rate limits in the policy layer: each request of a tenant with limits is counted in
//! the [`RateLedger`] before it is routed; past a limit it gets 429 with `Retry-After`,
//! and every answer to such a tenant carries OpenAI's `x-ratelimit-*` headers.
//!
//! Tokens are counted as OpenAI counts them at admission: the prompt estimate plus
//! `max_tokens` (or the policy's `assumed_output_tokens`), for each generation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use switchyard_policies::{Quota, RateDecision, RouteRequest};

use crate::policy::error::PolicyRejection;
use crate::policy::routing::PolicyRouting;

/// Counts `request` against its tenant's and key's limits under the current policy:
/// `None` when no limit applies to the caller, the ledger's decision when the request
/// fits, a [`PolicyRejection::RateLimited`] when it does not.
pub(crate) fn admit(
    routing: &PolicyRouting,
    request: &RouteRequest,
) -> Result<Option<RateDecision>, PolicyRejection> {
    let policy = routing.store().current();
    let output = request
        .max_output_tokens
        .unwrap_or(policy.routing().assumed_output_tokens);
    let tokens = u64::from(request.generations.max(1))
        * (u64::from(request.prompt_tokens) + u64::from(output));
    let claims = policy.rate_claims(&request.caller, tokens);
    if claims.is_empty() {
        return Ok(None);
    }
    let decision = routing.rate_ledger().take(&claims, now_ms());
    if decision.allowed {
        Ok(Some(decision))
    } else {
        Err(PolicyRejection::RateLimited { decision, tokens })
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the limits of
/// `decision` (the tightest of the tenant's and the key's of each kind).
pub(crate) fn add_headers(headers: &mut HeaderMap, decision: &RateDecision) {
    let kinds = [
        (
            decision.requests,
            [LIMIT_REQUESTS, REMAINING_REQUESTS, RESET_REQUESTS],
        ),
        (
            decision.tokens,
            [LIMIT_TOKENS, REMAINING_TOKENS, RESET_TOKENS],
        ),
    ];
    for (quota, [limit, remaining, reset]) in kinds {
        let Some(Quota {
            limit: l,
            remaining: r,
            reset: t,
        }) = quota
        else {
            continue;
        };
        headers.insert(limit, HeaderValue::from(l));
        headers.insert(remaining, HeaderValue::from(r));
        if let Ok(value) = HeaderValue::from_str(&duration_text(t)) {
            headers.insert(reset, value);
        }
    }
}

/// A duration as OpenAI writes its resets: `17s`, `1m0s`, `250ms`.
fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    match secs {
        s if s < 60 => format!("{s}s"),
        s => format!("{}m{}s", s / 60, s % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        assert_eq!(duration_text(Duration::from_millis(250)), "250ms");
        assert_eq!(duration_text(Duration::from_millis(16_200)), "17s");
        assert_eq!(duration_text(Duration::from_secs(60)), "1m0s");
    }

    #[test]
    fn every_limit_of_the_decision_becomes_three_headers() {
        let mut headers = HeaderMap::new();
        let quota = |limit, remaining| Quota {
            limit,
            remaining,
            reset: Duration::from_secs(30),
        };
        add_headers(
            &mut headers,
            &RateDecision {
                allowed: true,
                requests: Some(quota(3, 1)),
                tokens: None,
                retry_after: Duration::ZERO,
            },
        );
        assert_eq!(headers["x-ratelimit-limit-requests"], "3");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
        assert_eq!(headers["x-ratelimit-reset-requests"], "30s");
        assert!(!headers.contains_key("x-ratelimit-limit-tokens"));
    }
}
