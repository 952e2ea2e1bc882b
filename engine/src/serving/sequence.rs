//! One sequence inside the executor: its tokens, KV cache, sampler and stop
//! checker, and what happens to each token it samples.

use std::ops::Range;
use std::time::Instant;

use switchyard_kernels::Backend;
use switchyard_seam::{CacheScope, TenantShare};

use std::sync::Arc;

use super::queue::{EventSink, SequenceEvent, SequenceRequest, SequenceTask, SequenceToken};
use crate::kv::{KvBlocks, KvError, SequenceKv};
use crate::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};
use crate::sampling::{FinishReason, Sampler, StopChecker};
use crate::speculate::{self, DraftControl, DraftRun, Ngram};
use crate::structured::TokenMask;
use crate::tokenizer::DecodeStream;

/// Where a step's drafts come from (`Group::draft`).
pub(super) struct Drafter<'a, B: Backend> {
    /// Prompt lookup, tried first (it costs nothing).
    pub(super) ngram: Option<Ngram>,
    /// The checkpoint's draft model, when the lookup found nothing.
    pub(super) model: Option<ModelDrafter<'a, B>>,
}

/// A draft model and what running it needs.
pub(super) struct ModelDrafter<'a, B: Backend> {
    pub(super) backend: &'a B,
    pub(super) model: &'a LlamaModel<B>,
    pub(super) blocks: &'a Arc<KvBlocks<B>>,
    pub(super) scratch: &'a mut Scratch<B>,
}

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
    /// Its speculation's draft length and on/off; `None`: it never drafts.
    speculation: Option<DraftControl>,
    /// This step's verify rows: the last sampled token, then the drafted
    /// tokens after it (empty: no draft this step).
    verify: Vec<u32>,
    /// Its tokens in the draft model's cache, while it drafts from one.
    draft_run: Option<DraftRun<B>>,
    /// Tokens it may still generate (`max_tokens` less those generated).
    max_tokens: Option<usize>,
    /// Draft tokens verified and kept since the group last took them (metrics).
    drafted: usize,
    accepted: usize,
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
        speculation: Option<DraftControl>,
    ) -> Self {
        // An embedding reads its prompt once and samples nothing to draft after.
        let speculation = speculation.filter(|_| request.task != SequenceTask::Embed);
        Sequence {
            speculation,
            verify: Vec::new(),
            draft_run: None,
            max_tokens: request.stop.max_tokens,
            drafted: 0,
            accepted: 0,
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

    /// Drafts this step's tokens when `allowed` (the executor is not busy)
    /// and its controller wants some: at most `room` rows beyond its own,
    /// and never past its cache or its `max_tokens`. Clears last step's.
    /// The draft model's cache is given back while the sequence may not
    /// draft (the executor is busy: the budget serves others first).
    pub(super) fn draft(&mut self, allowed: bool, drafter: &mut Drafter<'_, B>, room: usize) {
        self.verify.clear();
        if !allowed || !self.is_decoding() {
            self.draft_run = None;
            return;
        }
        let Some(control) = self.speculation.as_mut() else {
            return;
        };
        let generated = self.tokens.len() - self.prompt_len;
        // The draft's last token is written at `tokens.len() + k - 1`; the
        // token sampled after the last draft is one more generated.
        let limit = [
            room,
            speculate::MAX_DRAFT,
            self.capacity.saturating_sub(self.tokens.len()),
            self.max_tokens
                .map_or(usize::MAX, |m| m.saturating_sub(generated + 1)),
        ]
        .into_iter()
        .min()
        .unwrap_or(0);
        if limit == 0 {
            return;
        }
        let wanted = control.wanted().min(limit);
        if wanted == 0 {
            return;
        }
        let Some(&last) = self.tokens.last() else {
            return;
        };
        self.verify.push(last);
        if let Some(ngram) = &drafter.ngram {
            ngram.draft(&self.tokens, wanted, &mut self.verify);
        }
        // A paused controller skips this draft; the draft model is not run
        // for a draft that would be skipped.
        let found = self.verify.len() > 1;
        if found && !control.allows() {
            self.verify.truncate(1);
        } else if !found && drafter.model.is_some() && control.allows() {
            if let Some(model) = drafter.model.as_mut() {
                self.draft_from_model(model, wanted);
            }
        }
        if self.verify.len() == 1 {
            self.verify.clear();
        }
    }

    /// Appends up to `wanted` tokens of the draft model's greedy
    /// continuation to `verify`. A cache the budget cannot hold now, or a
    /// failed draft step, leaves the step without a draft: speculation is
    /// an optimisation, never a reason to fail the sequence.
    fn draft_from_model(&mut self, drafter: &mut ModelDrafter<'_, B>, wanted: usize) {
        if self.draft_run.is_none() {
            let made = DraftRun::new(
                drafter.backend,
                drafter.blocks,
                drafter.model,
                self.capacity,
            );
            match made {
                Ok(run) => self.draft_run = Some(run),
                Err(e) => {
                    tracing::debug!("no draft model cache for a sequence: {e}");
                    return;
                }
            }
        }
        let Some(run) = self.draft_run.as_mut() else {
            return;
        };
        let drafted = run.draft(
            drafter.backend,
            drafter.model,
            drafter.scratch,
            &self.tokens,
            wanted,
            &mut self.verify,
        );
        if let Err(e) = drafted {
            tracing::debug!("the draft model failed a step: {e}");
            self.verify.truncate(1);
            self.draft_run = None;
        }
    }

    /// Rows it runs this step if it decodes: its token and its draft.
    pub(super) fn decode_rows(&self) -> usize {
        self.verify.len().max(1)
    }

    /// Its share of this step: the tokens of `span` (from `Group::plan`).
    /// A decoding span of more than one row verifies the draft (every
    /// row's logits); other spans run `tokens[span]`, the last row's
    /// logits wanted when the span reaches the end of the tokens.
    pub(super) fn chunk(
        &mut self,
        backend: &B,
        span: Range<usize>,
    ) -> Result<SequenceChunk<'_>, KvError> {
        let verifying = self.is_decoding() && span.len() > 1;
        let (tokens, logits) = if self.embeds() {
            // `plan` keeps spans inside `tokens`; empty if it ever did not.
            let tokens = self.tokens.get(span.clone()).unwrap_or_default();
            (tokens, LogitRows::Pooled)
        } else if verifying {
            let rows = self.verify.get(..span.len()).unwrap_or_default();
            (rows, LogitRows::All)
        } else {
            let wants_logits = span.end == self.tokens.len();
            // `plan` keeps spans inside `tokens`; empty if it ever did not.
            let tokens = self.tokens.get(span.clone()).unwrap_or_default();
            let rows = if wants_logits {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            (tokens, rows)
        };
        // Decode and verify steps come after the prompt.
        let prompt = !self.is_decoding();
        Ok(SequenceChunk {
            tokens,
            start_pos: span.start,
            table: self.cache.prepare(backend, span)?,
            logits,
            prompt,
        })
    }

    /// Emits the tokens of a verify step from its `rows` (the logits after
    /// its last token and after each draft token, `verify.len()` of them
    /// or fewer): the kept drafts, then the token sampled in the first
    /// missed draft's place or after the last draft (`speculate::verify`).
    /// The cache's positions past the kept tokens are dropped. Returns
    /// whether the sequence goes on.
    pub(super) fn accept_verified(&mut self, rows: &[&[f32]]) -> bool {
        let draft: Vec<u32> = self.verify.get(1..rows.len()).unwrap_or_default().to_vec();
        let mut goes_on = true;
        let verdict = speculate::verify(&draft, rows.iter().copied(), |row| {
            goes_on = self.accept_logits(row);
            goes_on.then(|| self.tokens.last().copied()).flatten()
        });
        self.verify.clear();
        self.drafted += draft.len();
        self.accepted += verdict.accepted;
        if let Some(control) = self.speculation.as_mut() {
            control.record(draft.len(), verdict.accepted);
        }
        if !goes_on {
            return false;
        }
        // The cache holds every kept token's entry; the last emitted one
        // runs next step, from where the rejected drafts begin.
        self.processed = self.tokens.len() - 1;
        if let Err(e) = self.cache.truncate(self.processed) {
            self.fail(format!("rolling back a rejected draft failed: {e}"));
            return false;
        }
        true
    }

    /// Draft tokens verified and kept since the last call (for metrics).
    pub(super) fn take_speculation(&mut self) -> (usize, usize) {
        (
            std::mem::take(&mut self.drafted),
            std::mem::take(&mut self.accepted),
        )
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
        self.stop.stop_unsure(&mut step, &sampled.margin);
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
                margin: sampled.margin,
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
