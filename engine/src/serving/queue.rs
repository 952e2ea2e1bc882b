//! What a caller hands the executor and what it gets back.

use std::sync::mpsc;
use std::time::Instant;

use switchyard_kernels::Backend;
use switchyard_seam::{CacheScope, TenantShare};

use super::checkpoint::CheckpointHandle;
use crate::kv::KvAdvice;
use crate::sampling::{FinishReason, SamplingParams, StopCondition};
use crate::structured::TokenMask;
use crate::tokenizer::DecodeStream;

/// One generation, ready to run: a tokenized prompt and how to continue it.
pub struct SequenceRequest {
    /// The prompt's token ids (chat template and BOS already applied).
    pub prompt: Vec<u32>,
    /// How to pick tokens (validated by the caller).
    pub sampling: SamplingParams,
    /// Stop tokens, stop strings and the token limit. With no `max_tokens`
    /// the sequence may run to the end of the context window.
    pub stop: StopCondition,
    /// Turns the generated ids into text for stop strings and output;
    /// `None` reports ids only (stop strings then never match).
    pub decoder: Option<DecodeStream>,
    /// Where the sequence's events go; when it closes, the sequence is cancelled.
    pub sink: Box<dyn EventSink>,
    /// When the client wants it finished (its request timeout); the
    /// scheduler runs a checkpoint sooner as its requests' deadlines near.
    pub deadline: Option<Instant>,
    /// The grammar the output must follow (structured outputs, forced tool
    /// calls); `None`: any token may come.
    pub constraint: Option<TokenMask>,
    /// Whose cached prompt blocks it may read and add to.
    pub cache_scope: CacheScope,
    /// Whose request it is, for fair admission (`fair.rs`).
    pub share: TenantShare,
    /// Generate tokens, or only read the prompt for its embedding.
    pub task: SequenceTask,
}

/// What a sequence is run for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SequenceTask {
    /// Sample tokens after the prompt.
    #[default]
    Generate,
    /// Run the prompt only and report its mean-pooled, L2-normalised final
    /// hidden state ([`SequenceEvent::Embedding`]); it reads and adds
    /// nothing to the prompt cache, whose cached positions it would not see.
    Embed,
}

/// One generated token as the executor reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceToken {
    /// The token id.
    pub id: u32,
    /// Text to show now: may be empty while a character is incomplete or
    /// while text that may start a stop string is held back.
    pub text: String,
    /// Log-probability of the token (biased and penalised logits, temperature 1).
    pub logprob: f32,
    /// The most likely alternatives, most likely first, when asked for.
    pub top_logprobs: Vec<(u32, f32)>,
    /// How decided the pick was.
    pub margin: switchyard_seam::TokenMargin,
}

/// What a sequence reports, in order: `Token`s, then one `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum SequenceEvent {
    /// One sampled token. A stop token ending the sequence is not reported
    /// (unless held-back text has to be released with it).
    Token(SequenceToken),
    /// The sequence ended normally.
    Done {
        /// Stop token or stop string (`Stop`), token limit or context end (`Length`).
        finish_reason: FinishReason,
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Of those, the tokens whose KV came from the prompt cache.
        cached_tokens: usize,
        /// Tokens sampled, the final stop token included.
        completion_tokens: usize,
    },
    /// The sequence failed; the message says why.
    Error(String),
    /// An [`SequenceTask::Embed`] sequence's embedding: its prompt's final
    /// hidden states (after the output norm) averaged over every token, then
    /// scaled to unit length, as llama.cpp's server computes it.
    Embedding {
        /// `hidden_size` floats.
        vector: Vec<f32>,
        /// Tokens in the prompt.
        prompt_tokens: usize,
    },
}

/// Receives one sequence's events on the executor thread.
///
/// Must not block: the whole batch waits for it.
pub trait EventSink: Send {
    /// Delivers `event`; `false` when the receiver is gone, which cancels
    /// the sequence.
    fn send(&mut self, event: SequenceEvent) -> bool;

    /// Whether the receiver is gone, checked before every step so that a
    /// cancelled sequence leaves even before its next token.
    fn is_closed(&self) -> bool {
        false
    }
}

impl EventSink for mpsc::Sender<SequenceEvent> {
    fn send(&mut self, event: SequenceEvent) -> bool {
        mpsc::Sender::send(self, event).is_ok()
    }
}

impl SequenceRequest {
    /// What KV admission reads of it.
    pub(crate) fn kv_wanted(&self) -> crate::kv::admission::Wanted {
        crate::kv::admission::Wanted {
            prompt: self.prompt.len(),
            max_tokens: self.stop.max_tokens,
        }
    }
}

/// Why a request was refused before it was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Nothing to continue.
    #[error("the prompt has no tokens; send at least one token to continue")]
    EmptyPrompt,
    /// The waiting queue is full.
    #[error("{queued} requests are already waiting, the executor's limit; retry later")]
    Overloaded {
        /// Requests waiting when this one came.
        queued: usize,
    },
    /// Even alone, the request's KV cache would not fit the server's KV
    /// budget: its prompt plus `max_tokens` (or, without `max_tokens`, the
    /// whole context window) is too many positions.
    #[error(
        "the request needs a KV cache of {positions} positions ({needed_bytes} bytes) but the \
         server's KV budget is {budget_bytes} bytes; {advice}"
    )]
    KvBudget {
        /// Positions the cache would hold (prompt + max_tokens, at most the context).
        positions: usize,
        needed_bytes: usize,
        budget_bytes: usize,
        /// What to change: a smaller `max_tokens`, or a shorter prompt.
        advice: KvAdvice,
        /// Whether the prompt alone (with one token to generate) does not
        /// fit either.
        prompt_too_long: bool,
    },
    /// The request's generations together would reserve more than the share
    /// of the KV budget one request may hold ([`crate::kv::admission::REQUEST_SHARE`]),
    /// which would leave every other client waiting behind it.
    #[error(
        "the request's {fanout} generations need KV caches of about {needed_bytes} bytes \
         together, more than the {share_bytes} bytes (1/{share} of the server's KV budget) one \
         request may reserve; lower n, max_tokens or the number of prompts"
    )]
    KvShare {
        /// Generations of the request (`n` × prompts).
        fanout: usize,
        /// Their caches' bytes together (at least).
        needed_bytes: usize,
        /// What one request may reserve.
        share_bytes: usize,
        /// The budget's denominator.
        share: usize,
    },
    /// The request's generations together would reserve more than its tenant's part
    /// of the KV budget (the policy's `kv_share`): it could never run.
    #[error(
        "the request's {fanout} generation(s) need KV caches of about {needed_bytes} bytes \
         together, more than the {share_bytes} bytes ({permille}/1000 of the server's KV budget) \
         the tenant's requests may reserve at once; lower max_tokens or n, or raise the \
         tenant's kv_share in the policy"
    )]
    TenantKvShare {
        /// Generations of the request (`n` × prompts).
        fanout: usize,
        /// Their caches' bytes together (at least).
        needed_bytes: usize,
        /// What the tenant's running sequences may reserve together.
        share_bytes: usize,
        /// The tenant's part of the budget, in thousandths.
        permille: u16,
    },
    /// The tenant's requests fill its part of the waiting queue.
    #[error(
        "{waiting} of this tenant's requests are already waiting, its part of the server's \
         queue (the policy's kv_share); retry when some have finished"
    )]
    TenantQueueFull {
        /// The tenant's requests waiting when this one came.
        waiting: usize,
    },
    /// The executor thread is gone.
    #[error("the executor thread has stopped (it panicked or was shut down); restart the server")]
    Stopped,
}

/// A request waiting for a batch slot.
pub(super) struct Waiting {
    pub(super) request: SequenceRequest,
    pub(super) arrived: Instant,
    /// Bytes its cache reserves when nothing of it is cached, for its
    /// tenant's cap (`tenant_cap.rs`); computed once, when it is queued.
    pub(super) kv_bytes: usize,
    /// Its place in its tenant's part of the queue, given back when it
    /// leaves the queue however it leaves.
    pub(super) _ticket: Option<super::tenant_cap::QueueTicket>,
}

/// What one checkpoint's request travels with to the executor thread.
pub(super) struct Submission<B: Backend> {
    pub(super) checkpoint: CheckpointHandle<B>,
    pub(super) request: SequenceRequest,
    pub(super) arrived: Instant,
    pub(super) ticket: Option<super::tenant_cap::QueueTicket>,
}
