//! One sequence inside the executor: its tokens, KV cache, sampler and stop
//! checker, and what happens to each token it samples.

use std::ops::Range;
use std::time::Instant;

use switchyard_kernels::Backend;
use switchyard_seam::{CacheScope, TenantShare};

use super::queue::{EventSink, SequenceEvent, SequenceRequest, SequenceTask, SequenceToken};
use crate::kv::SequenceKv;
use crate::sampling::{FinishReason, Sampler, StopChecker};
use crate::structured::TokenMask;
use crate::tokenizer::DecodeStream;

/// An admitted sequence.
pub(super) struct Sequence<B: Backend> {
    /// Prompt then generated tokens; `tokens[processed..]` are not in the cache yet.
    pub(super) tokens: Vec<u32>,
    pub(super) cache: SequenceKv<B>,
    /// Tokens already run through the model (held by `cache`).
    pub(super) processed: usize,
    prompt_len: usize,
    /// Most tokens the cache holds; generation ends with `Length` there.
    capacity: usize,
    sampler: Sampler,
    stop: StopChecker,
    /// Ids that end generation (a copy of the stop condition's), so that
    /// such a token is not reported as output.
    stop_token_ids: Vec<u32>,
    decoder: Option<DecodeStream>,
    sink: Box<dyn EventSink>,
    deadline: Option<Instant>,
    constraint: Option<TokenMask>,
    /// Prompt tokens whose KV came from the prompt cache (not computed).
    cached_tokens: usize,
    /// Leading cache blocks already shared with the prompt cache.
    pub(super) shared_blocks: usize,
    /// Whose prompt-cache blocks it reads and adds to.
    pub(super) cache_scope: CacheScope,
    /// Whose request it is, for fair admission.
    pub(super) share: TenantShare,
    pub(super) task: SequenceTask,
    /// An embedding's sum of the hidden states of the prompt rows run so far.
    pooled: Vec<f64>,
}

impl<B: Backend> Sequence<B> {
    /// Takes over `request` with a cache of `capacity` tokens whose first
    /// `shared_blocks` blocks (`cached_tokens` positions) came from the
    /// prompt cache: the prompt runs from there.
    pub(super) fn new(
        request: SequenceRequest,
        cache: SequenceKv<B>,
        capacity: usize,
        shared_blocks: usize,
        cached_tokens: usize,
    ) -> Self {
        Sequence {
            prompt_len: request.prompt.len(),
            tokens: request.prompt,
            cache,
            processed: cached_tokens,
            cached_tokens,
            shared_blocks,
            capacity,
            sampler: Sampler::new(request.sampling),
            stop_token_ids: request.stop.stop_token_ids.clone(),
            stop: StopChecker::new(request.stop),
            decoder: request.decoder,
            sink: request.sink,
            deadline: request.deadline,
            constraint: request.constraint,
            cache_scope: request.cache_scope,
            share: request.share,
            task: request.task,
            pooled: Vec::new(),
        }
    }

    /// Whether it only reads its prompt for an embedding.
    pub(super) fn embeds(&self) -> bool {
        self.task == SequenceTask::Embed
    }

    /// Adds one step's pooled rows of an embedding (`sum`, from
    /// [`crate::model::StepOutput::pooled`]); once the whole prompt is in
    /// (`processed` already moved past this step's span), reports the mean
    /// scaled to unit length. Returns whether the sequence goes on.
    pub(super) fn accept_pooled(&mut self, sum: &[f32]) -> bool {
        if self.pooled.is_empty() {
            self.pooled = vec![0.0; sum.len()];
        }
        for (total, &value) in self.pooled.iter_mut().zip(sum) {
            *total += f64::from(value);
        }
        if self.processed < self.prompt_len {
            return true;
        }
        match crate::model::unit_mean(&self.pooled, self.prompt_len) {
            Some(vector) => {
                self.sink.send(SequenceEvent::Embedding {
                    vector,
                    prompt_tokens: self.prompt_len,
                });
            }
            None => self.fail(crate::model::ModelError::DegenerateEmbedding.to_string()),
        }
        false
    }

    /// When the client wants the sequence finished, if it said.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the client went away.
    pub(super) fn is_cancelled(&self) -> bool {
        self.sink.is_closed()
    }

    /// The prompt's tokens.
    pub(super) fn prompt(&self) -> &[u32] {
        self.tokens.get(..self.prompt_len).unwrap_or_default()
    }

    /// Whether the prompt is fully in the cache (the sequence decodes one token per step).
    pub(super) fn is_decoding(&self) -> bool {
        self.processed >= self.prompt_len
    }

    /// The tokens to run this step, given at most `budget` tokens.
    pub(super) fn next_span(&self, budget: usize) -> Range<usize> {
        let end = self.tokens.len().min(self.processed + budget);
        self.processed..end
    }

    /// The grammar the output follows, if the request set one.
    pub(super) fn constraint_mut(&mut self) -> Option<&mut TokenMask> {
        self.constraint.as_mut()
    }

    /// Reports a failure and ends the sequence.
    pub(super) fn fail(&mut self, message: String) {
        self.sink.send(SequenceEvent::Error(message));
    }

    /// Samples the next token from `logits` and reports it. Returns whether
    /// the sequence goes on.
    pub(super) fn accept_logits(&mut self, logits: &[f32]) -> bool {
        let history = self.tokens.get(self.prompt_len..).unwrap_or_default();
        let logits = match self.constraint.as_mut().map(|mask| mask.apply(logits)) {
            None => logits,
            Some(Ok(masked)) => masked,
            Some(Err(e)) => {
                self.fail(format!("the output grammar failed: {e}"));
                return false;
            }
        };
        let sampled = match self.sampler.sample(logits, history) {
            Ok(sampled) => sampled,
            Err(e) => {
                self.fail(format!("sampling failed: {e}"));
                return false;
            }
        };
        if let Some(Err(e)) = self.constraint.as_mut().map(|mask| mask.accept(sampled.id)) {
            self.fail(format!(
                "the output grammar refused token {}: {e}",
                sampled.id
            ));
            return false;
        }
        self.tokens.push(sampled.id);
        let text = match self.decoder.as_mut().map(|d| d.step(sampled.id)) {
            None | Some(Ok(None)) => String::new(),
            Some(Ok(Some(text))) => text,
            Some(Err(e)) => {
                self.fail(format!("decoding token {} failed: {e}", sampled.id));
                return false;
            }
        };
        let mut step = self.stop.push(sampled.id, &text);
        if step.finished.is_none() && self.tokens.len() >= self.capacity {
            // The end of the cache (the context window) before max_tokens.
            step.finished = Some(FinishReason::Length);
            step.text.push_str(&self.stop.flush());
        }
        if step.finished == Some(FinishReason::Length) {
            // An incomplete character at the very end is shown as it is.
            if let Some(Ok(Some(rest))) = self.decoder.as_mut().map(DecodeStream::flush) {
                step.text.push_str(&rest);
            }
        }
        let ended_by_stop_token =
            step.finished == Some(FinishReason::Stop) && self.stop_token_was_last();
        if !ended_by_stop_token || !step.text.is_empty() {
            let token = SequenceToken {
                id: sampled.id,
                text: step.text,
                logprob: sampled.logprob,
                top_logprobs: sampled.top_logprobs,
            };
            if !self.sink.send(SequenceEvent::Token(token)) {
                return false;
            }
        }
        match step.finished {
            Some(finish_reason) => {
                self.sink.send(SequenceEvent::Done {
                    finish_reason,
                    prompt_tokens: self.prompt_len,
                    cached_tokens: self.cached_tokens,
                    completion_tokens: self.tokens.len() - self.prompt_len,
                });
                false
            }
            None => true,
        }
    }

    /// Whether the last token is one of the stop tokens (EOS, end of turn).
    fn stop_token_was_last(&self) -> bool {
        self.tokens
            .last()
            .is_some_and(|id| self.stop_token_ids.contains(id))
    }
}
