//! The chunk shapes of a streamed chat completion.
//!
//! When the request has tools, each choice's text runs through a
//! [`ToolCallParser`]: plain text goes out as `content` as it comes, and a
//! call goes out once its `</tool_call>` arrives, as two `tool_calls`
//! pieces (id, type and name, then the arguments) that a client joins by
//! `index`, as it joins OpenAI's.

use std::collections::HashMap;

use crate::openai::responses::{
    ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, Delta, FunctionDelta, ToolCallDelta,
};
use crate::openai::tail::stream::ChunkFormat;
use crate::openai::tool_calls::{new_call_id, Piece, ToolCallParser};
use switchyard_seam::{FinishReason, GeneratedToken, Usage};

/// Builds `chat.completion.chunk`s for one response.
pub struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Whether the text is parsed for tool calls.
    parses_calls: bool,
    /// Per choice: its parser and how many calls it made.
    calls: HashMap<u32, (ToolCallParser, u32)>,
}

impl ChatChunks {
    /// Chunks carrying this id, timestamp and model name; with
    /// `parses_calls`, tool calls in the text become `tool_calls` deltas.
    pub fn new(
        id: String,
        created: u64,
        model: String,
        include_usage: bool,
        parses_calls: bool,
    ) -> Self {
        ChatChunks {
            id,
            created,
            model,
            include_usage,
            parses_calls,
            calls: HashMap::new(),
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            // With include_usage, OpenAI sends `"usage": null` in every chunk but the last.
            usage: self.include_usage.then(|| usage.map(Into::into)),
        }
    }

    fn content(
        &self,
        index: u32,
        text: String,
        logprobs: Option<ChatLogprobs>,
    ) -> ChatCompletionChunk {
        let delta = Delta {
            content: Some(text),
            ..Delta::default()
        };
        self.chunk(vec![choice(index, delta, logprobs, None)], None)
    }

    fn tool_call(&self, index: u32, delta: ToolCallDelta) -> ChatCompletionChunk {
        let delta = Delta {
            tool_calls: Some(vec![delta]),
            ..Delta::default()
        };
        self.chunk(vec![choice(index, delta, None, None)], None)
    }

    /// The chunks for `pieces` of choice `index`.
    fn pieces(&mut self, index: u32, pieces: Vec<Piece>) -> Vec<ChatCompletionChunk> {
        let mut chunks = Vec::new();
        for piece in pieces {
            let made = self.calls.get(&index).map_or(0, |(_, made)| *made);
            match piece {
                // The newlines between parallel calls are not content.
                Piece::Text(text) if made > 0 && text.trim().is_empty() => {}
                Piece::Text(text) => chunks.push(self.content(index, text, None)),
                Piece::Call(call) => {
                    let header = ToolCallDelta {
                        index: made,
                        id: Some(new_call_id()),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(call.name),
                            arguments: String::new(),
                        },
                    };
                    let arguments = ToolCallDelta {
                        index: made,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: call.arguments,
                        },
                    };
                    chunks.push(self.tool_call(index, header));
                    chunks.push(self.tool_call(index, arguments));
                    if let Some((_, made)) = self.calls.get_mut(&index) {
                        *made += 1;
                    }
                }
            }
        }
        chunks
    }
}

impl ChunkFormat for ChatChunks {
    type Chunk = ChatCompletionChunk;

    fn opening(&mut self, index: u32) -> Option<ChatCompletionChunk> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            tool_calls: None,
        };
        Some(self.chunk(vec![choice(index, delta, None, None)], None))
    }

    fn token(&mut self, index: u32, token: &GeneratedToken) -> Vec<ChatCompletionChunk> {
        let logprobs = ChatLogprobs::of(std::slice::from_ref(token));
        if !self.parses_calls {
            if token.text.is_empty() && logprobs.is_none() {
                return Vec::new();
            }
            return vec![self.content(index, token.text.clone(), logprobs)];
        }
        let (parser, _) = self.calls.entry(index).or_default();
        let pieces = parser.push(&token.text);
        let mut chunks = self.pieces(index, pieces);
        if logprobs.is_some() {
            // Log-probabilities go with the token, whether its text is out yet or held back.
            chunks.push(self.content(index, String::new(), logprobs));
        }
        chunks
    }

    fn finish(&mut self, index: u32, reason: FinishReason) -> Vec<ChatCompletionChunk> {
        let mut chunks = Vec::new();
        let mut reason = reason.as_str();
        if self.parses_calls {
            let (parser, _) = self.calls.entry(index).or_default();
            let rest = parser.finish();
            chunks = self.pieces(index, rest);
            if self.calls.get(&index).is_some_and(|(_, made)| *made > 0) {
                reason = "tool_calls";
            }
        }
        chunks.push(self.chunk(
            vec![choice(index, Delta::default(), None, Some(reason))],
            None,
        ));
        chunks
    }

    fn usage(&mut self, usage: Usage) -> ChatCompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

fn choice(
    index: u32,
    delta: Delta,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'static str>,
) -> ChatChunkChoice {
    ChatChunkChoice {
        index,
        delta,
        logprobs,
        finish_reason,
    }
}
