//! The chunk shapes of a streamed chat completion.

use crate::openai::responses::{ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, Delta};
use crate::sse::ChunkFormat;
use switchyard_seam::{FinishReason, GeneratedToken, Usage};

/// Builds `chat.completion.chunk`s for one response.
pub struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl ChatChunks {
    /// Chunks carrying this id, timestamp and model name.
    pub fn new(id: String, created: u64, model: String, include_usage: bool) -> Self {
        ChatChunks {
            id,
            created,
            model,
            include_usage,
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
}

impl ChunkFormat for ChatChunks {
    type Chunk = ChatCompletionChunk;

    fn opening(&mut self, index: u32) -> Option<ChatCompletionChunk> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        Some(self.chunk(vec![choice(index, delta, None, None)], None))
    }

    fn token(&mut self, index: u32, token: &GeneratedToken) -> Option<ChatCompletionChunk> {
        let logprobs = ChatLogprobs::of(std::slice::from_ref(token));
        if token.text.is_empty() && logprobs.is_none() {
            return None;
        }
        let delta = Delta {
            role: None,
            content: Some(token.text.clone()),
        };
        Some(self.chunk(vec![choice(index, delta, logprobs, None)], None))
    }

    fn finish(&mut self, index: u32, reason: FinishReason) -> ChatCompletionChunk {
        self.chunk(
            vec![choice(index, Delta::default(), None, Some(reason.as_str()))],
            None,
        )
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
