//! `POST /v1/chat/completions`: the [`ValidatedChatRequest`] (validated before routing,
//! see `openai/parse.rs`), its `n` generations submitted, answered with one JSON body or
//! an SSE stream.

use axum::extract::State;
use axum::response::Response;
use http::HeaderMap;
use serde_json::Value;

use crate::error::ApiError;
use crate::layers::timeout::Deadline;
use crate::openai::chat_stream::ChatChunks;
use crate::openai::json_response::json_response;
use crate::openai::params::{
    describe, invalid, parse_model, parse_top_logprobs, GenerationParams, ResponseMode,
};
use crate::openai::respond::{respond, Answer, Generations, Head};
use crate::openai::response_format::parse_response_format;
use crate::openai::responses::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, FunctionCall, ToolCallBody,
};
use crate::openai::tail::finished::Finished;
use crate::openai::tool_calls::{new_call_id, split, Piece};
use crate::openai::tools::{parse_tools, ToolSettings};
use crate::openai::types::{ChatCompletionRequest, WireMessage};
use crate::policy::{RoutedRequest, Validated};
use crate::state::AppState;
use switchyard_seam::{ChatMessage, Prompt, Role, ToolCall, Usage};

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
    /// The tools and what the model must do with them.
    pub tools: ToolSettings,
}

impl TryFrom<ChatCompletionRequest> for ValidatedChatRequest {
    type Error = ApiError;

    fn try_from(mut wire: ChatCompletionRequest) -> Result<Self, ApiError> {
        let mut shared = wire.take_shared();
        let model = parse_model(shared.model.take())?;
        let messages = parse_messages(wire.messages)?;
        let tools = parse_tools(
            wire.tools.as_ref(),
            wire.tool_choice.as_ref(),
            wire.parallel_tool_calls,
        )?;
        let format = parse_response_format(shared.response_format.take().as_ref())?;
        let constraint = match (format, tools.constraint()) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "response_format",
                    "a response format cannot be combined with tool_choice 'required' or a named function; drop one of them.".to_owned(),
                ))
            }
            (format, calls) => format.or(calls),
        };
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
        let max_tokens_field = match wire.max_completion_tokens {
            Some(value) => {
                shared.max_tokens = Some(value);
                "max_completion_tokens"
            }
            None => "max_tokens",
        };
        let (params, mode) = shared.parse(max_tokens_field, logprobs)?;
        let params = GenerationParams {
            tools: tools.tools.clone(),
            constraint,
            ..params
        };
        Ok(ValidatedChatRequest {
            model,
            messages,
            params,
            mode,
            tools,
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
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| parse_message(i, message))
        .collect::<Result<Vec<_>, _>>()?;
    check_tool_results(&messages)?;
    Ok(messages)
}

/// Every `tool` message must answer a call an earlier assistant message made.
fn check_tool_results(messages: &[ChatMessage]) -> Result<(), ApiError> {
    for (i, message) in messages.iter().enumerate() {
        let Some(id) = &message.tool_call_id else {
            continue;
        };
        let called = messages[..i]
            .iter()
            .flat_map(|earlier| &earlier.tool_calls)
            .any(|call| &call.id == id);
        if !called {
            return Err(invalid(
                &format!("messages[{i}].tool_call_id"),
                format!("'{id}' answers no tool call of an earlier assistant message; quote the id of a call in 'tool_calls'."),
            ));
        }
    }
    Ok(())
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
        Some("tool") => Role::Tool,
        Some(other) => {
            return Err(invalid(
                &format!("messages[{i}].role"),
                format!(
                "'{other}' is not a supported role; use one of system, developer, user, assistant, tool."
            ),
            ))
        }
    };
    let tool_calls = match (role, &message.tool_calls) {
        (_, None | Some(Value::Null)) => Vec::new(),
        (Role::Assistant, Some(calls)) => parse_tool_calls(i, calls)?,
        (_, Some(_)) => {
            return Err(invalid(
                &format!("messages[{i}].tool_calls"),
                "only assistant messages carry tool_calls.".to_owned(),
            ))
        }
    };
    let tool_call_id = match (role, message.tool_call_id) {
        (Role::Tool, Some(id)) => Some(id),
        (Role::Tool, None) => {
            return Err(ApiError::MissingParameter {
                param: format!("messages[{i}].tool_call_id"),
            })
        }
        (_, _) => None,
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
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id,
    })
}

/// An assistant message's `tool_calls`, as the client sends them back.
fn parse_tool_calls(i: usize, calls: &Value) -> Result<Vec<ToolCall>, ApiError> {
    let Value::Array(calls) = calls else {
        return Err(ApiError::InvalidType {
            param: format!("messages[{i}].tool_calls"),
            detail: format!("expected an array of tool calls, found {}", describe(calls)),
        });
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let field = |name: &str| format!("messages[{i}].tool_calls[{j}].{name}");
            let text = |name: &str, value: Option<&Value>| match value {
                Some(Value::String(text)) => Ok(text.clone()),
                Some(other) => Err(ApiError::InvalidType {
                    param: field(name),
                    detail: format!("expected a string, found {}", describe(other)),
                }),
                None => Err(ApiError::MissingParameter { param: field(name) }),
            };
            let function = call.get("function");
            Ok(ToolCall {
                id: text("id", call.get("id"))?,
                name: text("function.name", function.and_then(|f| f.get("name")))?,
                arguments: text(
                    "function.arguments",
                    function.and_then(|f| f.get("arguments")),
                )?,
            })
        })
        .collect()
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

/// The handler.
pub async fn chat_completions(
    State(state): State<AppState>,
    routed: RoutedRequest,
    headers: HeaderMap,
    deadline: Deadline,
    Validated(request): Validated<ValidatedChatRequest>,
) -> Response {
    let ValidatedChatRequest {
        model,
        messages,
        params,
        mode,
        tools,
    } = request;
    let generations = Generations {
        model,
        prompts: vec![Prompt::Chat(messages)],
        params,
        mode,
    };
    let answer = ChatAnswer {
        parses_calls: tools.parses_calls(),
    };
    respond(&state, &routed, &headers, deadline, generations, answer).await
}

/// A chat completion: `chat.completion.chunk`s or one `chat.completion`; with tools,
/// calls in the text become `tool_calls`.
struct ChatAnswer {
    parses_calls: bool,
}

impl Answer for ChatAnswer {
    const PROMPT_FIELD: &'static str = "messages";
    const ID_PREFIX: &'static str = "chatcmpl";
    type Chunks = ChatChunks;

    fn chunks(self, head: Head, include_usage: bool) -> ChatChunks {
        ChatChunks::new(
            head.id,
            head.created,
            head.model,
            include_usage,
            self.parses_calls,
        )
    }

    fn whole(
        self,
        head: Head,
        finished: Vec<Finished>,
        usage: Usage,
    ) -> Result<Response, ApiError> {
        let choices = finished
            .into_iter()
            .map(|choice| {
                let (message, called) = if self.parses_calls {
                    message_with_calls(&choice.text)
                } else {
                    (plain_message(choice.text), false)
                };
                ChatChoice {
                    index: choice.index,
                    logprobs: ChatLogprobs::of(&choice.tokens),
                    message,
                    finish_reason: if called {
                        "tool_calls"
                    } else {
                        choice.finish_reason.as_str()
                    },
                }
            })
            .collect();
        let body = ChatCompletion {
            id: head.id,
            object: "chat.completion",
            created: head.created,
            model: head.model,
            choices,
            usage: usage.into(),
        };
        json_response(&body, Self::PROMPT_FIELD)
    }
}

fn plain_message(text: String) -> AssistantMessage {
    AssistantMessage {
        role: "assistant",
        content: Some(text),
        tool_calls: Vec::new(),
    }
}

/// The answer split into text and calls, and whether it made any call.
/// Text around calls that is only whitespace (the newlines between
/// parallel calls) is not content.
fn message_with_calls(text: &str) -> (AssistantMessage, bool) {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for piece in split(text) {
        match piece {
            Piece::Text(text) => content.push_str(&text),
            Piece::Call(call) => tool_calls.push(ToolCallBody {
                id: new_call_id(),
                kind: "function",
                function: FunctionCall {
                    name: call.name,
                    arguments: call.arguments,
                },
            }),
        }
    }
    let called = !tool_calls.is_empty();
    let content = if called && content.trim().is_empty() {
        None
    } else {
        Some(content)
    };
    let message = AssistantMessage {
        role: "assistant",
        content,
        tool_calls,
    };
    (message, called)
}
