//! Response bodies and stream chunks in OpenAI's exact shapes.

use std::collections::BTreeMap;

use serde::Serialize;

use switchyard_seam::{GeneratedToken, Usage};

/// `usage` of a response or of the last stream chunk.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct UsageBody {
    /// Prompt tokens (each prompt once).
    pub prompt_tokens: u32,
    /// Generated tokens over all choices.
    pub completion_tokens: u32,
    /// The sum.
    pub total_tokens: u32,
    /// What the prompt tokens were made of.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV the prompt cache supplied (not computed).
    pub cached_tokens: u32,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        UsageBody {
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens.saturating_add(usage.completion_tokens),
        }
    }
}

/// `POST /v1/chat/completions` answer.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-<request id>`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model name as requested.
    pub model: String,
    /// One per choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: UsageBody,
}

/// One chat choice.
#[derive(Debug, Serialize)]
pub struct ChatChoice {
    /// Its index.
    pub index: u32,
    /// The generated message.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: &'static str,
}

/// The generated message.
#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text; `null` when the answer is only tool calls.
    pub content: Option<String>,
    /// The calls the model made, when it made any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
}

/// One tool call in an answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ToolCallBody {
    /// `call_...`, which the `tool` message answering it quotes.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// One tool call's piece in a stream chunk: the first carries id, type and
/// name; later ones add to `arguments`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Which call of the choice (0, 1, ...).
    pub index: u32,
    /// Set in the call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in the call's first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name (first piece) and arguments text.
    pub function: FunctionDelta,
}

/// The function part of a tool-call piece.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FunctionDelta {
    /// Set in the call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments text.
    pub arguments: String,
}

/// Chat log-probabilities.
#[derive(Debug, Serialize)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One token's log-probability and alternatives.
#[derive(Debug, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The UTF-8 bytes of the token's text.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative.
#[derive(Debug, Serialize)]
pub struct ChatTopLogprob {
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    /// Log-probabilities of `tokens`; `None` when the backend gave none
    /// (logprobs were not asked for).
    pub fn of(tokens: &[GeneratedToken]) -> Option<ChatLogprobs> {
        let content = tokens
            .iter()
            .map(|token| {
                Some(ChatTokenLogprob {
                    token: token.text.clone(),
                    logprob: token.logprob?,
                    bytes: token.text.as_bytes().to_vec(),
                    top_logprobs: token
                        .top_logprobs
                        .iter()
                        .map(|top| ChatTopLogprob {
                            token: top.text.clone(),
                            logprob: top.logprob,
                            bytes: top.text.as_bytes().to_vec(),
                        })
                        .collect(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        (!content.is_empty()).then_some(ChatLogprobs { content })
    }
}

/// One SSE chunk of a chat completion.
#[derive(Debug, Serialize)]
pub struct ChatCompletionChunk {
    /// Same id in every chunk of a response.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds, same in every chunk.
    pub created: u64,
    /// The model name as requested.
    pub model: String,
    /// Zero (usage chunk) or one choice.
    pub choices: Vec<ChatChunkChoice>,
    /// Absent unless `include_usage`; then `null` except in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageBody>>,
}

/// The choice part of a chat chunk.
#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    /// Its index.
    pub index: u32,
    /// What this chunk adds.
    pub delta: Delta,
    /// Log-probabilities of this chunk's token, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<&'static str>,
}

/// What a chat chunk adds to the message.
#[derive(Debug, Default, Serialize)]
pub struct Delta {
    /// `assistant` in a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// `POST /v1/completions` answer, and each of its SSE chunks.
#[derive(Debug, Serialize)]
pub struct TextCompletion {
    /// `cmpl-<request id>`.
    pub id: String,
    /// Always `text_completion` (chunks too, as OpenAI does).
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model name as requested.
    pub model: String,
    /// The choices (one per chunk when streaming, none in the usage chunk).
    pub choices: Vec<TextChoice>,
    /// Always present in whole responses; in streams as for chat chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageBody>>,
}

/// One completion choice (or its piece in a chunk).
#[derive(Debug, Serialize)]
pub struct TextChoice {
    /// The text (or the piece of it this chunk adds).
    pub text: String,
    /// Its index: prompt index × n + choice.
    pub index: u32,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<TextLogprobs>,
    /// Set when the choice is done.
    pub finish_reason: Option<&'static str>,
}

/// Legacy completions log-probabilities.
#[derive(Debug, Serialize)]
pub struct TextLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// Alternatives per token, text → log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the completion text.
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// Log-probabilities of `tokens`, the first starting at `offset`
    /// characters into the text; `None` when the backend gave none.
    pub fn of(tokens: &[GeneratedToken], mut offset: usize) -> Option<TextLogprobs> {
        let mut logprobs = TextLogprobs {
            tokens: Vec::with_capacity(tokens.len()),
            token_logprobs: Vec::with_capacity(tokens.len()),
            top_logprobs: Vec::with_capacity(tokens.len()),
            text_offset: Vec::with_capacity(tokens.len()),
        };
        for token in tokens {
            logprobs.token_logprobs.push(token.logprob?);
            logprobs.tokens.push(token.text.clone());
            logprobs.top_logprobs.push(
                token
                    .top_logprobs
                    .iter()
                    .map(|top| (top.text.clone(), top.logprob))
                    .collect(),
            );
            logprobs.text_offset.push(offset);
            offset += token.text.chars().count();
        }
        (!logprobs.tokens.is_empty()).then_some(logprobs)
    }
}
