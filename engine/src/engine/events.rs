//! The executor's events for one sequence, turned into the seam's and sent to
//! the router's stream. Runs on the executor thread, so it never blocks.

use switchyard_seam::{
    BackendError, GeneratedToken, GenerationEvent, TokenConfidence, TokenMargin, TopLogprob, Usage,
};
use tokio::sync::mpsc;

use crate::serving::{EventSink, SequenceEvent};
use crate::tokenizer::Tokenizer;

/// Sends one sequence's events to its [`switchyard_seam::GenerationStream`].
pub(super) struct StreamSink {
    sender: mpsc::Sender<GenerationEvent>,
    tokenizer: Tokenizer,
    logprobs: bool,
    /// Every generated token's log-probability, for the answer's [`TokenConfidence`]
    /// (kept whether or not the client asked for logprobs: cascades read it).
    seen: Vec<f32>,
    /// Every generated token's margin, in order, for the same summary.
    margins: Vec<TokenMargin>,
}

impl StreamSink {
    pub(super) fn new(
        sender: mpsc::Sender<GenerationEvent>,
        tokenizer: Tokenizer,
        logprobs: bool,
    ) -> Self {
        StreamSink {
            sender,
            tokenizer,
            logprobs,
            seen: Vec::new(),
            margins: Vec::new(),
        }
    }

    fn token(&self, token: crate::serving::SequenceToken) -> GeneratedToken {
        if !self.logprobs {
            return GeneratedToken {
                text: token.text,
                id: token.id,
                logprob: None,
                top_logprobs: Vec::new(),
                margin: Some(token.margin),
            };
        }
        let top_logprobs = token
            .top_logprobs
            .iter()
            .map(|&(id, logprob)| TopLogprob {
                text: self.tokenizer.decode(&[id], false).unwrap_or_default(),
                id,
                logprob,
            })
            .collect();
        GeneratedToken {
            text: token.text,
            id: token.id,
            logprob: Some(token.logprob),
            top_logprobs,
            margin: Some(token.margin),
        }
    }
}

impl EventSink for StreamSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        let event = match event {
            SequenceEvent::Token(token) => {
                self.seen.push(token.logprob);
                self.margins.push(token.margin);
                GenerationEvent::Token(self.token(token))
            }
            SequenceEvent::Done {
                finish_reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => GenerationEvent::Done {
                finish_reason,
                usage: Usage {
                    prompt_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
                    cached_tokens: u32::try_from(cached_tokens).unwrap_or(u32::MAX),
                    completion_tokens: u32::try_from(completion_tokens).unwrap_or(u32::MAX),
                },
                confidence: TokenConfidence::of(&mut self.seen, &self.margins),
            },
            SequenceEvent::Error(message) => {
                GenerationEvent::Error(BackendError::Internal { message })
            }
            SequenceEvent::Embedding { .. } => GenerationEvent::Error(BackendError::Internal {
                message: "a generation reported an embedding".to_owned(),
            }),
        };
        // Full: the reader is EVENT_BUFFER events behind; it gets cancelled, not buffered.
        self.sender.try_send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}
