//! `POST /v1/chat/completions`: parse into a [`ValidatedChatRequest`], submit
//! `n` generations, answer with one JSON body or an SSE stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde_json::Value;

use crate::error::ApiError;
use crate::layers::request_id::request_id;
use crate::layers::request_metrics::labelled_response;
use crate::openai::chat_stream::ChatChunks;
use crate::openai::extract::OpenAiJson;
use crate::openai::generate::{check_fanout, merge, UsageTally};
use crate::openai::json_response::json_response;
use crate::openai::params::{
    describe, invalid, parse_model, parse_top_logprobs, CommonFields, GenerationParams,
    ResponseMode,
};
use crate::openai::responses::{AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs};
use crate::openai::types::{ChatCompletionRequest, WireMessage};
use crate::openai::unix_now;
use crate::policy::{self, RoutedRequest};
use crate::sse::{stream_response, StreamSettings};
use crate::state::AppState;
use switchyard_seam::{ChatMessage, Prompt, Role};

/// A chat request that passed every check the router can make.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedChatRequest {
    /// The model name as sent.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Generation parameters.
    pub params: GenerationParams,
    /// Whole JSON or SSE.
    pub mode: ResponseMode,
}

impl TryFrom<ChatCompletionRequest> for ValidatedChatRequest {
    type Error = ApiError;

    fn try_from(wire: ChatCompletionRequest) -> Result<Self, ApiError> {
        let model = parse_model(wire.model)?;
        let messages = parse_messages(wire.messages)?;
        if wire.tools.as_ref().is_some_and(|tools| !tools.is_empty()) {
            return Err(ApiError::Unsupported {
                param: "tools".to_owned(),
                message: "tool calling is not supported by this server; remove 'tools'.".to_owned(),
            });
        }
        check_response_format(wire.response_format.as_ref())?;
        let logprobs = match (wire.logprobs.unwrap_or(false), wire.top_logprobs) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs set to true; set logprobs to true or drop top_logprobs.".to_owned(),
                ))
            }
            (true, top) => Some(parse_top_logprobs("top_logprobs", top.unwrap_or(0))?),
        };
        // max_completion_tokens replaces max_tokens; when both come, the newer wins.
        let (max_tokens, max_tokens_field) = match wire.max_completion_tokens {
            Some(value) => (Some(value), "max_completion_tokens"),
            None => (wire.max_tokens, "max_tokens"),
        };
        let (params, mode) = CommonFields {
            max_tokens,
            max_tokens_field,
            temperature: wire.temperature,
            top_p: wire.top_p,
            n: wire.n,
            stop: wire.stop,
            seed: wire.seed,
            presence_penalty: wire.presence_penalty,
            frequency_penalty: wire.frequency_penalty,
            logit_bias: wire.logit_bias,
            logprobs,
            user: wire.user,
            stream: wire.stream,
            stream_options: wire.stream_options,
        }
        .parse()?;
        Ok(ValidatedChatRequest {
            model,
            messages,
            params,
            mode,
        })
    }
}

fn parse_messages(messages: Option<Vec<WireMessage>>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages.ok_or_else(|| ApiError::MissingParameter {
        param: "messages".to_owned(),
    })?;
    if messages.is_empty() {
        return Err(invalid(
            "messages",
            "[] is empty; send at least one message.".to_owned(),
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| parse_message(i, message))
        .collect()
}

fn parse_message(i: usize, message: WireMessage) -> Result<ChatMessage, ApiError> {
    let role = match message.role.as_deref() {
        None => {
            return Err(ApiError::MissingParameter {
                param: format!("messages[{i}].role"),
            })
        }
        Some("system") => Role::System,
        Some("developer") => Role::Developer,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some(other) => {
            return Err(invalid(
                &format!("messages[{i}].role"),
                format!(
                "'{other}' is not a supported role; use one of system, developer, user, assistant."
            ),
            ))
        }
    };
    let content = match message.content {
        // An assistant turn that only called tools has no content.
        None | Some(Value::Null) if role == Role::Assistant => String::new(),
        None | Some(Value::Null) => {
            return Err(ApiError::MissingParameter {
                param: format!("messages[{i}].content"),
            })
        }
        Some(Value::String(text)) => text,
        Some(Value::Array(parts)) => parse_parts(i, parts)?,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: format!("messages[{i}].content"),
                detail: format!(
                    "expected a string or an array of text parts, found {}",
                    describe(&other)
                ),
            })
        }
    };
    Ok(ChatMessage { role, content })
}

/// Joins `[{"type": "text", "text": ...}, ...]` into one string.
fn parse_parts(i: usize, parts: Vec<Value>) -> Result<String, ApiError> {
    let mut content = String::new();
    for (j, part) in parts.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        match part.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some(other) => {
                return Err(ApiError::Unsupported {
                    param: format!("{param}.type"),
                    message: format!(
                        "'{other}' content parts are not supported; send parts of type 'text'."
                    ),
                })
            }
            None => {
                return Err(ApiError::InvalidType {
                    param,
                    detail: format!(
                    "expected an object like {{\"type\": \"text\", \"text\": \"...\"}}, found {}",
                    describe(part)
                ),
                })
            }
        }
        match part.get("text") {
            Some(Value::String(text)) => content.push_str(text),
            Some(other) => {
                return Err(ApiError::InvalidType {
                    param: format!("{param}.text"),
                    detail: format!("expected a string, found {}", describe(other)),
                })
            }
            None => {
                return Err(ApiError::MissingParameter {
                    param: format!("{param}.text"),
                })
            }
        }
    }
    Ok(content)
}

fn check_response_format(format: Option<&Value>) -> Result<(), ApiError> {
    match format {
        None | Some(Value::Null) => Ok(()),
        Some(format) if format.get("type").and_then(Value::as_str) == Some("text") => Ok(()),
        Some(format) => Err(ApiError::Unsupported {
            param: "response_format".to_owned(),
            message: format!(
                "{} is not supported; only {{\"type\": \"text\"}} is.",
                describe(format)
            ),
        }),
    }
}

/// The handler.
pub async fn chat_completions(
    State(state): State<AppState>,
    routed: RoutedRequest,
    headers: HeaderMap,
    OpenAiJson(wire): OpenAiJson<ChatCompletionRequest>,
) -> Response {
    if let Err(error) = check_fanout(1, wire.n, state.config().max_fanout) {
        return error.into_response();
    }
    let request = match ValidatedChatRequest::try_from(wire) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let requested = request.model.clone();
    let outcome = respond(&state, &routed, &request_id(&headers), request).await;
    labelled_response(&routed.backend_model(&requested), outcome)
}

async fn respond(
    state: &AppState,
    routed: &RoutedRequest,
    request_id: &str,
    request: ValidatedChatRequest,
) -> Result<Response, ApiError> {
    let ValidatedChatRequest {
        model: requested,
        messages,
        params,
        mode,
    } = request;
    let prompts = vec![Prompt::Chat(messages)];
    // Built again only when a fallback checkpoint takes over the request.
    let make = |model: &str| params.requests(request_id, model, prompts.clone());
    let id = format!("chatcmpl-{request_id}");
    let created = unix_now();
    match mode {
        ResponseMode::Stream { include_usage } => {
            let choices =
                policy::submit::submit(state, routed, &requested, &make, "messages").await?;
            let model = routed.backend_model(&requested);
            let settings = StreamSettings {
                choices: params.n,
                n: params.n,
                include_usage,
                prompt_field: "messages",
                keep_alive: state.config().sse_keep_alive,
            };
            let format = ChatChunks::new(id, created, model, include_usage);
            let events =
                policy::submit::observe(merge(choices), routed.clone(), params.n, params.n);
            Ok(stream_response(events, format, settings))
        }
        ResponseMode::Whole => {
            let finished = policy::submit::finish_whole(
                state, routed, &requested, &make, "messages", params.n,
            )
            .await?;
            let model = routed.backend_model(&requested);
            let mut tally = UsageTally::new(params.n);
            let choices = finished
                .into_iter()
                .map(|choice| {
                    tally.add(choice.index, choice.usage);
                    ChatChoice {
                        index: choice.index,
                        logprobs: ChatLogprobs::of(&choice.tokens),
                        message: AssistantMessage {
                            role: "assistant",
                            content: choice.text,
                        },
                        finish_reason: choice.finish_reason.as_str(),
                    }
                })
                .collect();
            json_response(
                &ChatCompletion {
                    id,
                    object: "chat.completion",
                    created,
                    model,
                    choices,
                    usage: tally.total().into(),
                },
                "messages",
            )
        }
    }
}
