//! The chunk shapes of a streamed legacy completion.

use std::collections::HashMap;

use crate::openai::responses::{TextChoice, TextCompletion, TextLogprobs};
use crate::openai::tail::stream::ChunkFormat;
use switchyard_seam::{FinishReason, GeneratedToken, Usage};

/// Builds `text_completion` chunks for one response.
pub struct TextChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Characters streamed so far per choice, for `text_offset`.
    offsets: HashMap<u32, usize>,
}

impl TextChunks {
    /// Chunks carrying this id, timestamp and model name.
    pub fn new(id: String, created: u64, model: String, include_usage: bool) -> Self {
        TextChunks {
            id,
            created,
            model,
            include_usage,
            offsets: HashMap::new(),
        }
    }

    fn chunk(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: self.include_usage.then(|| usage.map(Into::into)),
        }
    }
}

impl ChunkFormat for TextChunks {
    type Chunk = TextCompletion;

    fn opening(&mut self, _index: u32) -> Option<TextCompletion> {
        None
    }

    fn token(&mut self, index: u32, token: &GeneratedToken) -> Vec<TextCompletion> {
        let offset = self.offsets.entry(index).or_default();
        let logprobs = TextLogprobs::of(std::slice::from_ref(token), *offset);
        *offset += token.text.chars().count();
        if token.text.is_empty() && logprobs.is_none() {
            return Vec::new();
        }
        let choice = TextChoice {
            text: token.text.clone(),
            index,
            logprobs,
            finish_reason: None,
        };
        vec![self.chunk(vec![choice], None)]
    }

    fn finish(&mut self, index: u32, reason: FinishReason) -> Vec<TextCompletion> {
        let choice = TextChoice {
            text: String::new(),
            index,
            logprobs: None,
            finish_reason: Some(reason.as_str()),
        };
        vec![self.chunk(vec![choice], None)]
    }

    fn usage(&mut self, usage: Usage) -> TextCompletion {
        self.chunk(Vec::new(), Some(usage))
    }
}
