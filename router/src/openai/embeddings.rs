//! `POST /v1/embeddings`, in OpenAI's shape: `input` (a string, strings, token ids or
//! token-id arrays), `model`, `encoding_format` (`float` or `base64`), `dimensions`
//! (only the model's own size: it cannot be shortened). Each input becomes one
//! [`EmbeddingRequest`]; the engine runs them as sequences of their checkpoint, so many
//! inputs and concurrent requests share its forward steps.
//!
//! The policy layer routes and authenticates it like a generation (`RoutableRequest`):
//! the reservation counts every input's prompt and no output, and the route is settled
//! with the prompt tokens the engine counted (`usage.prompt_tokens`).

use std::collections::VecDeque;

use axum::extract::State;
use axum::response::Response;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_policies::{estimate_tokens, ModelHint};
use switchyard_seam::{
    BackendError, EmbeddingInput, EmbeddingReply, EmbeddingRequest, ModelSpec, TenantShare, Usage,
};

use crate::error::ApiError;
use crate::layers::request_metrics::labelled_response;
use crate::layers::timeout::Deadline;
use crate::openai::completions::parse_token_ids;
use crate::openai::json_response::json_response;
use crate::openai::params::{describe, invalid, parse_model};
use crate::openai::parse::wire;
use crate::policy::{ParseLimits, RoutableRequest, RoutedRequest, RoutingFields, Validated};
use crate::state::AppState;

/// The field every input error names (`input[i]` for one of several).
const INPUT: &str = "input";
/// Inputs one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;
/// Inputs of one request in the engine's queue at once: enough to fill its steps,
/// few enough that a 2,048-input request does not fill the queue other clients use.
const IN_FLIGHT: usize = 64;

/// `POST /v1/embeddings` body. Loose types, as in `openai/types.rs`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingsWire {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

/// How the vectors are written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// The little-endian `f32` bytes, base64 (what the official Python client asks for).
    Base64,
}

/// An embeddings request that passed every check the router can make.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedEmbeddingRequest {
    /// The model name as sent.
    pub model: String,
    /// One or more inputs, in the response's order.
    pub inputs: Vec<EmbeddingInput>,
    pub format: EncodingFormat,
    /// The size asked for; the engine checks it against the model.
    pub dimensions: Option<u32>,
    pub user: Option<String>,
}

impl TryFrom<EmbeddingsWire> for ValidatedEmbeddingRequest {
    type Error = ApiError;

    fn try_from(wire: EmbeddingsWire) -> Result<Self, ApiError> {
        let model = parse_model(wire.model)?;
        let inputs = parse_inputs(wire.input)?;
        let format = match wire.encoding_format.as_deref() {
            None | Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            Some(other) => {
                return Err(invalid(
                    "encoding_format",
                    format!("`{other}` is not a format; use `float` or `base64`."),
                ))
            }
        };
        let dimensions = wire
            .dimensions
            .map(|d| {
                u32::try_from(d).ok().filter(|&d| d > 0).ok_or_else(|| {
                    invalid(
                        "dimensions",
                        format!("{d} is not a size; send a positive integer or leave it out."),
                    )
                })
            })
            .transpose()?;
        Ok(ValidatedEmbeddingRequest {
            model,
            inputs,
            format,
            dimensions,
            user: wire.user.filter(|user| !user.is_empty()),
        })
    }
}

/// `input`: a string, strings, token ids, or arrays of token ids; none empty.
fn parse_inputs(input: Option<Value>) -> Result<Vec<EmbeddingInput>, ApiError> {
    let items = match input {
        None | Some(Value::Null) => {
            return Err(ApiError::MissingParameter {
                param: INPUT.to_owned(),
            })
        }
        Some(Value::String(text)) => return Ok(vec![text_input(INPUT, text)?]),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: INPUT.to_owned(),
                detail: format!(
                    "expected a string, an array of strings, or token-id arrays, found {}",
                    describe(&other)
                ),
            })
        }
    };
    if items.is_empty() {
        return Err(invalid(
            INPUT,
            "[] is empty; send a string or at least one input.".to_owned(),
        ));
    }
    // A flat array of integers is one tokenized input.
    if items.iter().all(Value::is_number) {
        return Ok(vec![EmbeddingInput::Tokens(parse_token_ids(
            INPUT, &items,
        )?)]);
    }
    if items.len() > MAX_INPUTS {
        return Err(invalid(
            INPUT,
            format!(
                "{} inputs is more than the {MAX_INPUTS} one request may hold; split them.",
                items.len()
            ),
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let param = format!("{INPUT}[{i}]");
            match item {
                Value::String(text) => text_input(&param, text),
                Value::Array(ids) => parse_token_ids(&param, &ids).map(EmbeddingInput::Tokens),
                other => Err(ApiError::InvalidType {
                    param,
                    detail: format!(
                        "expected a string or an array of token ids, found {}",
                        describe(&other)
                    ),
                }),
            }
        })
        .collect()
}

fn text_input(param: &str, text: String) -> Result<EmbeddingInput, ApiError> {
    if text.is_empty() {
        return Err(invalid(
            param,
            "the string is empty; send some text to embed.".to_owned(),
        ));
    }
    Ok(EmbeddingInput::Text(text))
}

impl RoutableRequest for ValidatedEmbeddingRequest {
    fn parse(body: &[u8], _limits: ParseLimits) -> Result<Self, ApiError> {
        ValidatedEmbeddingRequest::try_from(wire::<EmbeddingsWire>(body)?)
    }

    fn routing_fields(&self) -> RoutingFields {
        RoutingFields {
            model: ModelHint::parse(&self.model),
            // An embedding generates nothing.
            max_output_tokens: Some(0),
            user: self.user.clone(),
            prompt_tokens: self.inputs.iter().map(input_tokens).max().unwrap_or(0),
            generations: u32::try_from(self.inputs.len()).unwrap_or(u32::MAX),
        }
    }
}

/// One input's size for routing: text estimated as prompts are, token ids counted.
fn input_tokens(input: &EmbeddingInput) -> u32 {
    match input {
        EmbeddingInput::Text(text) => estimate_tokens(text.chars().count()),
        EmbeddingInput::Tokens(ids) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
    }
}

/// The handler.
pub async fn embeddings(
    State(state): State<AppState>,
    routed: RoutedRequest,
    headers: http::HeaderMap,
    deadline: Deadline,
    Validated(request): Validated<ValidatedEmbeddingRequest>,
) -> Response {
    let request_id = crate::layers::request_id::request_id(&headers);
    let requested = ModelSpec::parse(&request.model);
    let outcome = run(&state, &routed, &request_id, deadline, &requested, &request).await;
    labelled_response(&routed.backend_model(&requested).to_string(), outcome)
}

/// Embeds every input on the routed checkpoint (moving to the policy's fallback when
/// it refuses or fails), settles the route with the prompt tokens, and answers.
async fn run(
    state: &AppState,
    routed: &RoutedRequest,
    request_id: &str,
    deadline: Deadline,
    requested: &ModelSpec,
    request: &ValidatedEmbeddingRequest,
) -> Result<Response, ApiError> {
    if !routed.is_routed() {
        // Resolved here once: the inputs (and any retry) name the checkpoint itself.
        if let Some(checkpoint) = state.backend().pin_model(requested) {
            routed.pin(checkpoint);
        }
    }
    let share = routed.tenant_share();
    loop {
        let model = routed.backend_model(requested);
        match embed_all(state, request_id, deadline, &model, request, &share).await {
            Ok(vectors) => {
                let prompt_tokens = vectors.iter().map(|(_, tokens)| tokens).sum::<u32>();
                routed.succeeded(usage(prompt_tokens));
                return answer(model.to_string(), request.format, vectors);
            }
            Err(failure) if failure.done_tokens == 0 && routed.fall_back(&failure.error) => {
                continue
            }
            Err(failure) => {
                routed.failed(&failure.error, usage(failure.done_tokens));
                return Err(ApiError::backend(
                    name_input(failure.error, failure.index, request.inputs.len()),
                    INPUT,
                ));
            }
        }
    }
}

fn usage(prompt_tokens: u32) -> Usage {
    Usage {
        prompt_tokens,
        ..Usage::default()
    }
}

/// Why the inputs could not all be embedded.
struct Failure {
    error: BackendError,
    /// The input at fault.
    index: usize,
    /// Prompt tokens of the inputs embedded before it failed.
    done_tokens: u32,
}

/// Each input's vector and prompt tokens, in order. At most [`IN_FLIGHT`] inputs are
/// queued at once; the engine batches whatever is queued.
async fn embed_all(
    state: &AppState,
    request_id: &str,
    deadline: Deadline,
    model: &ModelSpec,
    request: &ValidatedEmbeddingRequest,
    share: &TenantShare,
) -> Result<Vec<(Vec<f32>, u32)>, Failure> {
    let backend = state.backend();
    let mut done: Vec<(Vec<f32>, u32)> = Vec::with_capacity(request.inputs.len());
    let done_tokens = |done: &[(Vec<f32>, u32)]| done.iter().map(|(_, t)| t).sum::<u32>();
    let mut pending: VecDeque<(usize, EmbeddingReply)> = VecDeque::new();
    let mut next = 0;
    loop {
        while next < request.inputs.len() && pending.len() < IN_FLIGHT {
            let Some(input) = request.inputs.get(next) else {
                break;
            };
            let embedding = EmbeddingRequest {
                request_id: format!("{request_id}/{next}"),
                model: model.clone(),
                input: input.clone(),
                dimensions: request.dimensions,
                share: share.clone(),
                deadline: deadline.0,
            };
            match backend.embed(embedding) {
                Ok(reply) => pending.push_back((next, reply)),
                // Dropping `pending` cancels the inputs already queued.
                Err(error) => {
                    return Err(Failure {
                        error,
                        index: next,
                        done_tokens: done_tokens(&done),
                    })
                }
            }
            next += 1;
        }
        let Some((index, reply)) = pending.pop_front() else {
            return Ok(done);
        };
        let result = reply.await.unwrap_or_else(|_| {
            Err(BackendError::Internal {
                message: format!("embedding {index} ended without an answer"),
            })
        });
        match result {
            Ok(embedding) => done.push((embedding.vector, embedding.prompt_tokens)),
            Err(error) => {
                return Err(Failure {
                    error,
                    index,
                    done_tokens: done_tokens(&done),
                })
            }
        }
    }
}

/// `error` naming `input[index]` rather than `input` when the request has several.
fn name_input(error: BackendError, index: usize, inputs: usize) -> BackendError {
    if inputs < 2 {
        return error;
    }
    let param = format!("{INPUT}[{index}]");
    match error {
        BackendError::InvalidRequest { param: p, message } if p == INPUT => {
            BackendError::InvalidRequest { param, message }
        }
        error @ BackendError::ContextOverflow { .. } => BackendError::InvalidRequest {
            param,
            message: error.to_string(),
        },
        other => other,
    }
}

#[derive(Serialize)]
struct EmbeddingList {
    object: &'static str,
    data: Vec<EmbeddingData>,
    model: String,
    usage: EmbeddingUsage,
}

#[derive(Serialize)]
struct EmbeddingData {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct EmbeddingUsage {
    prompt_tokens: u32,
    total_tokens: u32,
}

fn answer(
    model: String,
    format: EncodingFormat,
    vectors: Vec<(Vec<f32>, u32)>,
) -> Result<Response, ApiError> {
    let prompt_tokens = vectors.iter().map(|(_, tokens)| tokens).sum::<u32>();
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, (vector, _))| EmbeddingData {
            object: "embedding",
            index,
            embedding: match format {
                EncodingFormat::Float => Vector::Float(vector),
                EncodingFormat::Base64 => Vector::Base64(base64_f32(&vector)),
            },
        })
        .collect();
    let body = EmbeddingList {
        object: "list",
        data,
        model,
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    };
    json_response(&body, INPUT)
}

/// `vector` as OpenAI sends `encoding_format: base64`: its little-endian `f32`
/// bytes in standard, padded base64.
fn base64_f32(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ParseLimits = ParseLimits { max_fanout: 64 };

    fn parse(body: &str) -> Result<ValidatedEmbeddingRequest, ApiError> {
        ValidatedEmbeddingRequest::parse(body.as_bytes(), LIMITS)
    }

    fn param(body: &str) -> Option<String> {
        parse(body).err().and_then(|error| error.param())
    }

    #[test]
    fn every_input_shape_is_read() {
        let inputs = |input: &str| {
            parse(&format!(r#"{{"model": "m", "input": {input}}}"#))
                .map(|r| r.inputs)
                .map_err(|e| e.to_string())
        };
        let text = |t: &str| EmbeddingInput::Text(t.to_owned());
        assert_eq!(inputs(r#""hi""#), Ok(vec![text("hi")]));
        assert_eq!(inputs(r#"["a", "b"]"#), Ok(vec![text("a"), text("b")]));
        assert_eq!(
            inputs("[1, 2]"),
            Ok(vec![EmbeddingInput::Tokens(vec![1, 2])])
        );
        assert_eq!(
            inputs("[[1], [2, 3]]"),
            Ok(vec![
                EmbeddingInput::Tokens(vec![1]),
                EmbeddingInput::Tokens(vec![2, 3])
            ])
        );
    }

    #[test]
    fn bad_inputs_name_their_field() {
        assert_eq!(param(r#"{"model": "m"}"#), Some("input".to_owned()));
        assert_eq!(
            param(r#"{"model": "m", "input": ""}"#),
            Some("input".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": []}"#),
            Some("input".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": 7.5}"#),
            Some("input".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": ["a", ""]}"#),
            Some("input[1]".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": ["a", {"x": 1}]}"#),
            Some("input[1]".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": [[1], [-1]]}"#),
            Some("input[1][0]".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": "a", "encoding_format": "hex"}"#),
            Some("encoding_format".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": "a", "dimensions": 0}"#),
            Some("dimensions".to_owned())
        );
        assert_eq!(
            param(r#"{"model": "m", "input": "a", "dimensions": "big"}"#),
            Some("dimensions".to_owned())
        );
        let many = vec!["\"a\""; MAX_INPUTS + 1].join(",");
        assert_eq!(
            param(&format!(r#"{{"model": "m", "input": [{many}]}}"#)),
            Some("input".to_owned())
        );
        // One input of many token ids is not many inputs.
        let ids = vec!["1"; MAX_INPUTS + 1].join(",");
        assert_eq!(
            param(&format!(r#"{{"model": "m", "input": [{ids}]}}"#)),
            None
        );
    }

    #[test]
    fn routing_counts_every_input_and_no_output() {
        let fields = parse(r#"{"model": "m", "input": ["abcdefgh", [1, 2, 3]]}"#)
            .map(|r| r.routing_fields())
            .map_err(|e| e.to_string());
        assert_eq!(
            fields.map(|f| (f.prompt_tokens, f.generations, f.max_output_tokens)),
            Ok((3, 2, Some(0)))
        );
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        // 1.0f32 = 00 00 80 3f; -2.0f32 = 00 00 00 c0.
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
    }

    #[test]
    fn errors_of_one_of_several_inputs_name_it() {
        let error = BackendError::ContextOverflow {
            prompt_tokens: 9,
            max_tokens: 0,
            context: 8,
        };
        let named = name_input(error.clone(), 2, 3);
        assert!(
            matches!(named, BackendError::InvalidRequest { ref param, .. } if param == "input[2]")
        );
        assert_eq!(name_input(error.clone(), 0, 1), error);
    }
}
