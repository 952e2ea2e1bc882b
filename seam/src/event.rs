//! What a running generation reports back, token by token.

use serde::Serialize;
use tokio::sync::mpsc;

use crate::{BackendError, TokenConfidence, TokenMargin};

/// What a generation reports, in order: zero or more `Token`s, then exactly
/// one `Done` or `Error`, after which the sender is dropped.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// One generated token.
    Token(GeneratedToken),
    /// The generation finished normally.
    Done {
        /// Why it stopped.
        finish_reason: FinishReason,
        /// Token counts, as the engine measured them.
        usage: Usage,
        /// How sure the generation was of its tokens; `None` when it produced none
        /// or the backend does not measure it.
        confidence: Option<TokenConfidence>,
    },
    /// The generation failed after it was accepted.
    Error(BackendError),
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The text this token adds to the output. May be empty while a UTF-8
    /// character spans several tokens, or when the token is part of a stop
    /// string that is being held back.
    pub text: String,
    /// The token id.
    pub id: u32,
    /// The sampled token's log-probability, when logprobs were asked for.
    pub logprob: Option<f32>,
    /// The most likely alternatives, best first, when logprobs were asked for.
    pub top_logprobs: Vec<TopLogprob>,
    /// How decided the pick was (whether or not logprobs were asked for: a cascade
    /// judges a streamed answer's first token by it); `None` when not measured.
    pub margin: Option<TokenMargin>,
}

/// One alternative token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    /// The token's text.
    pub text: String,
    /// The token id.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context window.
    Length,
    /// Stopped after its first token, too unsure to go on
    /// ([`crate::GenerationRequest::stop_unsure`]): a cascade defers such an answer.
    Unsure,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            // Cut short; a cascade never shows such an answer (it defers it or asks again
            // without the stop), so a client reading this is told what it resembles.
            FinishReason::Length | FinishReason::Unsure => "length",
        }
    }
}

/// Token counts of a generation, or of a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    /// Tokens in the prompt after templating.
    pub prompt_tokens: u32,
    /// Of those, tokens whose KV the prompt cache supplied (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

/// The receiving end of one generation. Dropping it cancels the generation.
///
/// Bounded at [`EVENT_BUFFER`] events: the engine's scheduler sends without
/// blocking its batch (`try_send`), and a generation whose reader has fallen
/// that far behind (a client that stopped reading its stream) is cancelled
/// rather than buffered, so its slot and KV cache are freed. The engine
/// learns of a cancellation from a failed send or from `Sender::is_closed`.
pub type GenerationStream = mpsc::Receiver<GenerationEvent>;

/// Events a [`GenerationStream`] holds unread before its generation is
/// cancelled. Far more than a reading client lags by (the socket's buffers
/// come on top), far less than a long generation sends.
pub const EVENT_BUFFER: usize = 1024;
