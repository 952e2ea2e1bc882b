//! `POST /v1/completions`: the [`ValidatedCompletionRequest`] (validated before
//! routing, see `openai/parse.rs`), its prompts × `n` generations submitted, answered
//! whole or streamed.

use axum::extract::State;
use axum::response::Response;
use http::HeaderMap;
use serde_json::Value;

use crate::error::ApiError;
use crate::layers::timeout::Deadline;
use crate::openai::completions_stream::TextChunks;
use crate::openai::json_response::json_response;
use crate::openai::params::{
    describe, invalid, parse_model, parse_top_logprobs, GenerationParams, ResponseMode,
};
use crate::openai::respond::{respond, Answer, Generations, Head};
use crate::openai::response_format::parse_response_format;
use crate::openai::responses::{TextChoice, TextCompletion, TextLogprobs};
use crate::openai::tail::finished::Finished;
use crate::openai::types::CompletionRequest;
use crate::policy::{RoutedRequest, Validated};
use crate::state::AppState;
use switchyard_seam::{Prompt, Usage};

/// OpenAI's default `max_tokens` for legacy completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: i64 = 16;

/// A completion request that passed every check the router can make.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedCompletionRequest {
    /// The model name as sent.
    pub model: String,
    /// One or more prompts; each gets `n` choices.
    pub prompts: Vec<Prompt>,
    /// Generation parameters.
    pub params: GenerationParams,
    /// Whole JSON or SSE.
    pub mode: ResponseMode,
}

impl TryFrom<CompletionRequest> for ValidatedCompletionRequest {
    type Error = ApiError;

    fn try_from(mut wire: CompletionRequest) -> Result<Self, ApiError> {
        let mut shared = wire.take_shared();
        let model = parse_model(shared.model.take())?;
        let prompts = parse_prompts(wire.prompt)?;
        if wire.echo == Some(true) {
            return Err(ApiError::Unsupported {
                param: "echo".to_owned(),
                message: "echoing the prompt is not supported; set echo to false.".to_owned(),
            });
        }
        if let Some(best_of) = wire.best_of.filter(|&best_of| best_of != 1) {
            return Err(ApiError::Unsupported {
                param: "best_of".to_owned(),
                message: format!(
                    "best_of = {best_of} is not supported; use n and pick on the client."
                ),
            });
        }
        if wire
            .suffix
            .as_ref()
            .is_some_and(|suffix| !suffix.is_empty())
        {
            return Err(ApiError::Unsupported {
                param: "suffix".to_owned(),
                message: "suffix (fill-in-the-middle) is not supported; drop it.".to_owned(),
            });
        }
        let logprobs = wire
            .logprobs
            .map(|count| parse_top_logprobs("logprobs", count))
            .transpose()?;
        shared.max_tokens = Some(shared.max_tokens.unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS));
        let format = shared.response_format.take();
        let (params, mode) = shared.parse("max_tokens", logprobs)?;
        let params = GenerationParams {
            constraint: parse_response_format(format.as_ref())?,
            ..params
        };
        Ok(ValidatedCompletionRequest {
            model,
            prompts,
            params,
            mode,
        })
    }
}

/// `prompt`: a string, strings, token ids, or arrays of token ids.
fn parse_prompts(prompt: Option<Value>) -> Result<Vec<Prompt>, ApiError> {
    let items = match prompt {
        None | Some(Value::Null) => {
            return Err(ApiError::MissingParameter {
                param: "prompt".to_owned(),
            })
        }
        Some(Value::String(text)) => return Ok(vec![Prompt::Text(text)]),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: "prompt".to_owned(),
                detail: format!(
                    "expected a string, an array of strings, or token-id arrays, found {}",
                    describe(&other)
                ),
            })
        }
    };
    if items.is_empty() {
        return Err(invalid(
            "prompt",
            "[] is empty; send a string or at least one prompt.".to_owned(),
        ));
    }
    // A flat array of integers is one tokenized prompt.
    if items.iter().all(Value::is_number) {
        return Ok(vec![Prompt::Tokens(parse_token_ids("prompt", &items)?)]);
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(text) => Ok(Prompt::Text(text.clone())),
            Value::Array(ids) => parse_token_ids(&format!("prompt[{i}]"), ids).map(Prompt::Tokens),
            other => Err(ApiError::InvalidType {
                param: format!("prompt[{i}]"),
                detail: format!(
                    "expected a string or an array of token ids, found {}",
                    describe(other)
                ),
            }),
        })
        .collect()
}

/// Token ids of `param`, each an integer in `u32`; none is an error naming the
/// element at fault (shared with `embeddings.rs`).
pub(crate) fn parse_token_ids(param: &str, ids: &[Value]) -> Result<Vec<u32>, ApiError> {
    if ids.is_empty() {
        return Err(invalid(
            param,
            "[] is empty; send at least one token id.".to_owned(),
        ));
    }
    ids.iter()
        .enumerate()
        .map(|(j, id)| {
            id.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    invalid(
                        &format!("{param}[{j}]"),
                        format!(
                            "{} is not a token id; token ids are integers from 0 to {}.",
                            describe(id),
                            u32::MAX
                        ),
                    )
                })
        })
        .collect()
}

/// The handler.
pub async fn completions(
    State(state): State<AppState>,
    routed: RoutedRequest,
    headers: HeaderMap,
    deadline: Deadline,
    Validated(request): Validated<ValidatedCompletionRequest>,
) -> Response {
    let ValidatedCompletionRequest {
        model,
        prompts,
        params,
        mode,
    } = request;
    let generations = Generations {
        model,
        prompts,
        params,
        mode,
    };
    respond(&state, &routed, &headers, deadline, generations, TextAnswer).await
}

/// A legacy completion: `text_completion` chunks or one `text_completion`.
struct TextAnswer;

impl Answer for TextAnswer {
    const PROMPT_FIELD: &'static str = "prompt";
    const ID_PREFIX: &'static str = "cmpl";
    type Chunks = TextChunks;

    fn chunks(self, head: Head, include_usage: bool) -> TextChunks {
        TextChunks::new(head.id, head.created, head.model, include_usage)
    }

    fn whole(
        self,
        head: Head,
        finished: Vec<Finished>,
        usage: Usage,
    ) -> Result<Response, ApiError> {
        let choices = finished
            .into_iter()
            .map(|choice| TextChoice {
                logprobs: TextLogprobs::of(&choice.tokens, 0),
                text: choice.text,
                index: choice.index,
                finish_reason: Some(choice.finish_reason.as_str()),
            })
            .collect();
        let body = TextCompletion {
            id: head.id,
            object: "text_completion",
            created: head.created,
            model: head.model,
            choices,
            usage: Some(Some(usage.into())),
        };
        json_response(&body, Self::PROMPT_FIELD)
    }
}
