//! From an HTTP request to a [`RouteRequest`]: caller, `model`, hints and size estimates.
//!
//! Prompt tokens are *estimated* here, from the characters of the prompt text (about
//! four per token, [`estimate_tokens`], counted as `switchyard policy explain` counts
//! them); token-id prompts count exactly. Tokenizing for
//! real would need the checkpoint's tokenizer before the checkpoint is chosen. The
//! estimate only has to be right in magnitude: it drives the context, cost and budget
//! checks, while budgets are settled with the engine's exact counts when the request
//! ends. For several prompts (or `n > 1`) the estimate is that of one generation, the
//! largest: context limits apply per generation, and settling charges every one.

use http::header::AUTHORIZATION;
use http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use switchyard_policies::{estimate_tokens, stable_hash, Caller, Hints, ModelHint, RouteRequest};

use crate::error::ApiError;
use crate::policy::error::PolicyRejection;
use crate::policy::routing::PolicyRouting;

/// The only fields of a chat or completions body routing reads, read leniently: every
/// field is a raw value, so that a body the wire type refuses can still be routed and the
/// handler reports wrong types with its own precise messages.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawFields {
    model: Option<Value>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    user: Option<Value>,
    messages: Option<Value>,
    prompt: Option<Value>,
    n: Option<Value>,
}

/// What routing reads from a body, from the wire type
/// ([`crate::policy::body::RoutableBody`]) or from [`RawFields`]. Public only as the
/// return type of that trait; nothing outside this crate can build one.
#[derive(Debug)]
pub struct RoutingFields {
    /// The `model` hint; the handler's error when it is missing or not a string.
    pub(crate) model: Result<ModelHint, ApiError>,
    /// `max_completion_tokens`, else `max_tokens`, when a count that fits a `u32`.
    pub(crate) max_output_tokens: Option<u32>,
    /// A non-empty `user`.
    pub(crate) user: Option<String>,
    /// The estimated prompt size.
    pub(crate) prompt_tokens: u32,
    /// Generations the request fans out into (prompts × `n`), for the budget
    /// reservation.
    pub(crate) generations: u32,
}

impl From<RawFields> for RoutingFields {
    fn from(raw: RawFields) -> Self {
        let model = match raw.model {
            Some(Value::String(model)) => Ok(ModelHint::parse(&model)),
            None | Some(Value::Null) => Err(ApiError::MissingParameter {
                param: "model".to_owned(),
            }),
            Some(other) => Err(ApiError::InvalidType {
                param: "model".to_owned(),
                detail: format!(
                    "expected a model name string, found {}",
                    crate::openai::params::describe(&other)
                ),
            }),
        };
        let prompt_tokens = match (&raw.messages, &raw.prompt) {
            (Some(messages), _) => messages.as_array().map_or(0, |messages| {
                chat_tokens(messages.iter().map(|m| m.get("content")))
            }),
            (None, Some(prompt)) => prompt_tokens(prompt),
            (None, None) => 0,
        };
        let prompts = match &raw.messages {
            Some(_) => 1,
            None => raw.prompt.as_ref().map_or(1, prompt_count),
        };
        let generations = generations(prompts, raw.n.as_ref().and_then(Value::as_i64));
        RoutingFields {
            model,
            generations,
            max_output_tokens: raw
                .max_completion_tokens
                .or(raw.max_tokens)
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok()),
            user: match raw.user {
                Some(Value::String(user)) if !user.is_empty() => Some(user),
                _ => None,
            },
            prompt_tokens,
        }
    }
}

/// Why a body could not be turned into a route request.
#[derive(Debug)]
pub(crate) enum RequestProblem {
    /// The body itself is wrong (the handler would say the same).
    Api(ApiError),
    /// Credentials or hints are wrong.
    Policy(PolicyRejection),
}

/// Builds the route request of one HTTP request.
pub(crate) fn route_request(
    routing: &PolicyRouting,
    headers: &HeaderMap,
    request_id: &str,
    fields: RoutingFields,
) -> Result<RouteRequest, RequestProblem> {
    let model = fields.model.map_err(RequestProblem::Api)?;
    let caller = caller(routing, headers).map_err(RequestProblem::Policy)?;
    let mut request = RouteRequest::new(model, caller);
    request.hints = hints(headers).map_err(RequestProblem::Policy)?;
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
fn caller(routing: &PolicyRouting, headers: &HeaderMap) -> Result<Caller, PolicyRejection> {
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

/// Characters of every message's text (given as each message's `content`), as tokens.
/// Counted exactly as `switchyard policy explain` counts them, so the CLI predicts the
/// server's pick and cost; the chat template's few tokens per message are left to the
/// output margin.
pub(crate) fn chat_tokens<'a>(contents: impl Iterator<Item = Option<&'a Value>>) -> u32 {
    let mut chars = 0usize;
    for content in contents {
        match content {
            Some(Value::String(text)) => chars += text.chars().count(),
            Some(Value::Array(parts)) => {
                chars += parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(|t| t.chars().count())
                    .sum::<usize>();
            }
            _ => {}
        }
    }
    estimate_tokens(chars)
}

/// How many prompts a completions `prompt` holds (a flat array of numbers is one
/// tokenized prompt).
pub(crate) fn prompt_count(prompt: &Value) -> usize {
    match prompt {
        Value::Array(items) if !items.iter().all(Value::is_number) => items.len(),
        _ => 1,
    }
}

/// Generations of `prompts` prompts with `n` choices each; an `n` out of range counts
/// as 1 (the handler refuses it).
pub(crate) fn generations(prompts: usize, n: Option<i64>) -> u32 {
    let n = n
        .filter(|n| (1..=crate::openai::params::MAX_N).contains(n))
        .unwrap_or(1);
    u32::try_from(
        prompts
            .max(1)
            .saturating_mul(usize::try_from(n).unwrap_or(1)),
    )
    .unwrap_or(u32::MAX)
}

/// The largest prompt of a completions request: text estimated, token ids counted.
pub(crate) fn prompt_tokens(prompt: &Value) -> u32 {
    let one = |p: &Value| -> u32 {
        match p {
            Value::String(text) => estimate_tokens(text.chars().count()),
            Value::Array(ids) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
            _ => 0,
        }
    };
    match prompt {
        Value::Array(items) if items.iter().all(|i| i.is_number()) => one(prompt),
        Value::Array(items) => items.iter().map(one).max().unwrap_or(0),
        other => one(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn estimates_chat_and_prompt_sizes() {
        let chat = json!([{"role": "user", "content": "abcdefgh"},
                          {"role": "user", "content": [{"type": "text", "text": "abcd"}]}]);
        let contents = chat
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m.get("content"));
        assert_eq!(chat_tokens(contents), 3);
        assert_eq!(prompt_tokens(&json!("abcdefgh")), 2);
        assert_eq!(prompt_tokens(&json!([1, 2, 3])), 3);
        assert_eq!(prompt_tokens(&json!(["ab", "abcdefghijkl"])), 3);
        assert_eq!(prompt_tokens(&json!([[1], [1, 2]])), 2);
    }
}
