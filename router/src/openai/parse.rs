//! The first stage of an inference request: its body, parsed as one JSON object into
//! the endpoint's wire type ([`wire`]) and validated into its typed request
//! ([`ValidatedChatRequest`], [`ValidatedCompletionRequest`]), and what routing reads
//! from that one value. Every failure is an OpenAI-shaped [`ApiError`] naming the
//! field at fault.
//!
//! The policy layer calls [`RoutableRequest::parse`] before it routes, so a malformed
//! request is refused naming the field before it can reserve a budget; routing reads
//! [`RoutableRequest::routing_fields`] and the handler takes the same value.
//!
//! Prompt sizes are *estimated* from characters (about four per token, counted as
//! `switchyard policy explain` counts them, so the CLI predicts the server's pick and
//! cost); token-id prompts count exactly. For several prompts (or `n > 1`) the estimate
//! is that of one generation, the largest: context limits apply per generation, and
//! settling charges every one.

use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_policies::{estimate_tokens, ModelHint};
use switchyard_seam::{ChatMessage, Prompt};

use crate::error::ApiError;
use crate::openai::chat::ValidatedChatRequest;
use crate::openai::completions::ValidatedCompletionRequest;
use crate::openai::params::check_fanout;
use crate::openai::types::{ChatCompletionRequest, CompletionRequest};
use crate::policy::{ParseLimits, RoutableRequest, RoutingFields};

/// Parses `body`, which must hold one JSON object, as the wire type `T` (every
/// endpoint's first step: chat, completions, embeddings), naming the field with a
/// wrong JSON type.
pub fn wire<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // Well-formed bodies (nearly all) skip the field-path tracking only errors need.
    match try_parse_json_object(body) {
        Some(parsed) => Ok(parsed),
        None => parse_json_object(body),
    }
}

/// Parses `bytes` as `T` when they hold one JSON object that `T` accepts; `None`
/// otherwise, without saying why: the fast path for a caller that falls back to
/// [`parse_json_object`] for the error (tracking the path of every field, which only an
/// error needs, costs about a third of a parse).
fn try_parse_json_object<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    // As in `parse_json_object`: serde would read a struct from an array of its fields.
    if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

/// Parses `bytes`, which must hold one JSON object, as `T`, naming the path
/// of a field with the wrong type.
pub fn parse_json_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would happily read a struct from an array of its fields in order;
    // OpenAI bodies are objects, so anything else is refused up front.
    match bytes.iter().find(|byte| !byte.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            return Err(ApiError::InvalidJson {
                detail: "the body is JSON but not an object".to_owned(),
            })
        }
        None => {
            return Err(ApiError::InvalidJson {
                detail: "the body is empty".to_owned(),
            })
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // A wrong type on a named field is the client's most common mistake;
        // say which field. Syntax errors and a non-object body have no field.
        if inner.is_data() && path != "." {
            ApiError::InvalidType {
                param: path,
                detail: inner.to_string(),
            }
        } else {
            ApiError::InvalidJson {
                detail: inner.to_string(),
            }
        }
    })?;
    deserializer.end().map_err(|err| ApiError::InvalidJson {
        detail: err.to_string(),
    })?;
    Ok(value)
}

impl RoutableRequest for ValidatedChatRequest {
    fn parse(body: &[u8], limits: ParseLimits) -> Result<Self, ApiError> {
        let wire: ChatCompletionRequest = wire(body)?;
        check_fanout(1, wire.n, limits.max_fanout)?;
        ValidatedChatRequest::try_from(wire)
    }

    fn routing_fields(&self) -> RoutingFields {
        RoutingFields {
            model: ModelHint::parse(&self.model),
            max_output_tokens: self.params.max_tokens,
            user: non_empty(self.params.user.as_deref()),
            prompt_tokens: chat_tokens(&self.messages),
            generations: self.params.n,
        }
    }
}

impl RoutableRequest for ValidatedCompletionRequest {
    fn parse(body: &[u8], limits: ParseLimits) -> Result<Self, ApiError> {
        let wire: CompletionRequest = wire(body)?;
        check_fanout(
            wire.prompt.as_ref().map_or(1, prompt_count),
            wire.n,
            limits.max_fanout,
        )?;
        ValidatedCompletionRequest::try_from(wire)
    }

    fn routing_fields(&self) -> RoutingFields {
        let prompts = u32::try_from(self.prompts.len()).unwrap_or(u32::MAX);
        RoutingFields {
            model: ModelHint::parse(&self.model),
            max_output_tokens: self.params.max_tokens,
            user: non_empty(self.params.user.as_deref()),
            prompt_tokens: self.prompts.iter().map(prompt_tokens).max().unwrap_or(0),
            generations: prompts.max(1).saturating_mul(self.params.n),
        }
    }
}

/// An empty `user` keys no split stickiness: the same as none.
fn non_empty(user: Option<&str>) -> Option<String> {
    user.filter(|user| !user.is_empty()).map(str::to_owned)
}

/// Characters of every message's text, as tokens; the chat template's few tokens per
/// message are left to the output margin.
fn chat_tokens(messages: &[ChatMessage]) -> u32 {
    estimate_tokens(messages.iter().map(|m| m.content.chars().count()).sum())
}

/// One prompt's size: text estimated, token ids counted.
fn prompt_tokens(prompt: &Prompt) -> u32 {
    match prompt {
        Prompt::Text(text) => estimate_tokens(text.chars().count()),
        Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => {
            u32::try_from(ids.len()).unwrap_or(u32::MAX)
        }
        Prompt::Chat(messages) => chat_tokens(messages),
    }
}

/// How many prompts a completions `prompt` holds (a flat array of numbers is one
/// tokenized prompt), for the fan-out check before the prompts are validated.
pub(crate) fn prompt_count(prompt: &Value) -> usize {
    match prompt {
        Value::Array(items) if !items.iter().all(Value::is_number) => items.len(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ParseLimits = ParseLimits { max_fanout: 64 };

    #[test]
    fn chat_routing_reads_the_validated_request() {
        let body = br#"{"model": "auto", "max_completion_tokens": 7, "max_tokens": 3, "n": 2,
            "user": "", "messages": [{"role": "user", "content": "abcdefgh"},
            {"role": "user", "content": [{"type": "text", "text": "abcd"}]}]}"#;
        let fields = ValidatedChatRequest::parse(body, LIMITS)
            .map(|request| request.routing_fields())
            .map_err(|error| error.to_string());
        assert_eq!(
            fields,
            Ok(RoutingFields {
                model: ModelHint::parse("auto"),
                max_output_tokens: Some(7),
                user: None,
                prompt_tokens: 3,
                generations: 2,
            })
        );
    }

    #[test]
    fn completion_routing_counts_the_largest_prompt_and_every_generation() {
        let sizes = |prompt: &str| {
            let body = format!(r#"{{"model": "m", "prompt": {prompt}, "n": 3, "user": "u"}}"#);
            ValidatedCompletionRequest::parse(body.as_bytes(), LIMITS)
                .map(|request| {
                    let fields = request.routing_fields();
                    (fields.prompt_tokens, fields.generations, fields.user)
                })
                .map_err(|error| error.to_string())
        };
        let user = Some("u".to_owned());
        assert_eq!(sizes(r#""abcdefgh""#), Ok((2, 3, user.clone())));
        assert_eq!(sizes("[1, 2, 3]"), Ok((3, 3, user.clone())));
        assert_eq!(sizes(r#"["ab", "abcdefghijkl"]"#), Ok((3, 6, user.clone())));
        assert_eq!(sizes("[[1], [1, 2]]"), Ok((2, 6, user)));
    }

    #[test]
    fn invalid_bodies_are_refused_naming_the_field() {
        let param = |body: &str| {
            ValidatedChatRequest::parse(body.as_bytes(), LIMITS)
                .err()
                .and_then(|error| error.param())
        };
        assert_eq!(
            param(r#"{"model": "m", "messages": [], "temperature": "hot"}"#),
            Some("temperature".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "messages": []}"#),
            Some("messages".to_owned())
        );
        assert_eq!(
            param(r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
            Some("model".to_owned())
        );
        let fanout = ValidatedCompletionRequest::parse(
            br#"{"model": "m", "prompt": ["a", "b", "c"], "n": 16}"#,
            ParseLimits { max_fanout: 32 },
        );
        assert_eq!(fanout.err().and_then(|e| e.param()), Some("n".to_owned()));
    }

    /// The fields chat and completions share are declared once (`types.rs`), not
    /// flattened: a wrong JSON type in any of them is refused naming that field, by
    /// both endpoints.
    #[test]
    fn a_shared_field_of_a_wrong_type_is_named_by_both_endpoints() {
        use crate::openai::types::SharedFields;
        for &field in SharedFields::NAMES {
            let mut chat: serde_json::Map<String, Value> = serde_json::from_str(
                r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
            )
            .unwrap();
            let mut completion: serde_json::Map<String, Value> =
                serde_json::from_str(r#"{"model": "m", "prompt": "hi"}"#).unwrap();
            // An array of an array: no shared field takes that shape.
            let wrong = serde_json::json!([[[]]]);
            chat.insert(field.to_owned(), wrong.clone());
            completion.insert(field.to_owned(), wrong);
            let chat = ValidatedChatRequest::parse(&serde_json::to_vec(&chat).unwrap(), LIMITS);
            let completion = ValidatedCompletionRequest::parse(
                &serde_json::to_vec(&completion).unwrap(),
                LIMITS,
            );
            for (endpoint, param) in [
                ("chat", chat.err().and_then(|error| error.param())),
                (
                    "completions",
                    completion.err().and_then(|error| error.param()),
                ),
            ] {
                let param = param.unwrap_or_default();
                // `stop` and `stream_options` name the element at fault, `stop[0]`.
                let named = param == field || param.starts_with(&format!("{field}["));
                assert!(named, "{endpoint}: {field} refused as {param:?}");
            }
        }
        assert!(SharedFields::NAMES.contains(&"temperature"));
    }
}
