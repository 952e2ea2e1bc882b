//! Running a request's generations: submit them all, then either wait for
//! every one (whole JSON) or merge their events as they come (SSE).
//!
//! A [`Choice`] owns its [`GenerationStream`]; dropping a choice, or the
//! merged stream holding it, cancels that generation in the engine.

use std::time::Instant;

use futures_util::stream::{self, SelectAll, Stream};

use crate::error::ApiError;
use crate::metrics::GenerationMetrics;
use switchyard_seam::{
    BackendError, FinishReason, GeneratedToken, GenerationEvent, GenerationRequest,
    GenerationStream, InferenceBackend, TokenConfidence, Usage,
};

/// One running generation and its place in the response.
pub struct Choice {
    /// The choice's `index` in the response.
    pub index: u32,
    stream: GenerationStream,
    metrics: GenerationMetrics,
    submitted: Instant,
    seen_token: bool,
    finished: bool,
}

impl Choice {
    /// The next event; after `Done` or `Error`, `None`. A stream that closes
    /// without saying how it ended yields an `Internal` error.
    pub async fn next_event(&mut self) -> Option<GenerationEvent> {
        if self.finished {
            return None;
        }
        let event = match self.stream.recv().await {
            Some(event) => event,
            None => GenerationEvent::Error(BackendError::Internal {
                message: format!(
                    "generation {} ended without reporting how it finished",
                    self.index
                ),
            }),
        };
        match &event {
            GenerationEvent::Token(_) => {
                if !self.seen_token {
                    self.seen_token = true;
                    self.metrics.first_token(self.submitted.elapsed());
                }
                self.metrics.token();
            }
            GenerationEvent::Done { usage, .. } => {
                self.finished = true;
                self.metrics.prompt(usage.prompt_tokens);
            }
            GenerationEvent::Error(_) => self.finished = true,
        }
        Some(event)
    }
}

/// Submits every request, in order. If one is refused, the ones already
/// submitted are dropped (and so cancelled) and the refusal is returned.
pub fn submit_all(
    backend: &dyn InferenceBackend,
    requests: Vec<GenerationRequest>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    // Their count was checked once, when the request was validated (`check_fanout`).
    let mut choices = Vec::with_capacity(requests.len());
    for (index, request) in (0u32..).zip(requests) {
        // Series are created only after the backend accepted the model name, so
        // label values come from the served models, never from arbitrary input.
        let model = request.model.to_string();
        let submitted = Instant::now();
        let stream = backend
            .submit(request)
            .map_err(|err| ApiError::backend(err, prompt_field))?;
        let metrics = GenerationMetrics::for_model(&model);
        choices.push(Choice {
            index,
            stream,
            metrics,
            submitted,
            seen_token: false,
            finished: false,
        });
    }
    Ok(choices)
}

/// A generation that ran to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The choice's index.
    pub index: u32,
    /// The whole generated text.
    pub text: String,
    /// Every token, for log-probabilities.
    pub tokens: Vec<GeneratedToken>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Its token counts.
    pub usage: Usage,
    /// How sure the engine was of its tokens, when it measured that.
    pub confidence: Option<TokenConfidence>,
}

/// Waits for one choice to finish.
pub async fn finish(mut choice: Choice) -> Result<Finished, BackendError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = choice.next_event().await {
        match event {
            GenerationEvent::Token(token) => {
                text.push_str(&token.text);
                tokens.push(token);
            }
            GenerationEvent::Done {
                finish_reason,
                usage,
                confidence,
            } => {
                return Ok(Finished {
                    index: choice.index,
                    text,
                    tokens,
                    finish_reason,
                    usage,
                    confidence,
                })
            }
            GenerationEvent::Error(err) => return Err(err),
        }
    }
    // `next_event` always ends with Done or Error before None.
    Err(BackendError::Internal {
        message: format!("generation {} produced no final event", choice.index),
    })
}

/// Waits for every choice, concurrently. The first failure drops (cancels) the rest.
pub async fn finish_all(choices: Vec<Choice>) -> Result<Vec<Finished>, BackendError> {
    futures_util::future::try_join_all(choices.into_iter().map(finish)).await
}

/// The events of every choice as they come, tagged with the choice index.
pub type MergedEvents =
    SelectAll<std::pin::Pin<Box<dyn Stream<Item = (u32, GenerationEvent)> + Send>>>;

/// Merges the choices' events into one stream that owns the choices.
pub fn merge(choices: Vec<Choice>) -> MergedEvents {
    stream::select_all(choices.into_iter().map(|choice| {
        let events = stream::unfold(choice, |mut choice| async move {
            let event = choice.next_event().await?;
            Some(((choice.index, event), choice))
        });
        Box::pin(events) as std::pin::Pin<Box<dyn Stream<Item = _> + Send>>
    }))
}

/// The events of generations that already ran to their end, as they came: each
/// choice's tokens, then its `Done`, one choice after another.
pub fn replay(finished: Vec<Finished>) -> MergedEvents {
    stream::select_all(finished.into_iter().map(|f| {
        let index = f.index;
        let done = GenerationEvent::Done {
            finish_reason: f.finish_reason,
            usage: f.usage,
            confidence: f.confidence,
        };
        let events = f
            .tokens
            .into_iter()
            .map(GenerationEvent::Token)
            .chain(std::iter::once(done))
            .map(move |event| (index, event));
        Box::pin(stream::iter(events)) as std::pin::Pin<Box<dyn Stream<Item = _> + Send>>
    }))
}

/// Sums the usage of a request's choices the way OpenAI reports it: each
/// prompt's tokens once (not once per choice), every completion token.
#[derive(Debug, Clone, Copy)]
pub struct UsageTally {
    n: u32,
    total: Usage,
}

impl UsageTally {
    /// A tally for a request with `n` choices per prompt.
    pub fn new(n: u32) -> Self {
        UsageTally {
            n: n.max(1),
            total: Usage::default(),
        }
    }

    /// Adds the usage of choice `index`.
    pub fn add(&mut self, index: u32, usage: Usage) {
        if index.is_multiple_of(self.n) {
            self.total.prompt_tokens += usage.prompt_tokens;
            self.total.cached_tokens += usage.cached_tokens;
        }
        self.total.completion_tokens += usage.completion_tokens;
    }

    /// The sum so far.
    pub fn total(&self) -> Usage {
        self.total
    }
}
