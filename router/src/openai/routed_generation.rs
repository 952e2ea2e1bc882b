//! Running a routed request's generations: fallbacks when the chosen checkpoint refuses
//! or fails, and settling the route when the request ends (whole JSON or stream).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::{self, Stream};

use crate::error::ApiError;
use crate::openai::generate::{
    finish_all, merge, replay, submit_all, Choice, Finished, MergedEvents, UsageTally,
};
use crate::policy::routed::RoutedRequest;
use crate::state::AppState;
use switchyard_seam::{
    BackendError, GenerationEvent, GenerationRequest, ModelSpec, Prompt, TokenConfidence, Usage,
};

/// Prompts of at most this many bytes (tool definitions included) are prepared
/// (templated, tokenized) on the async worker that handles the request; larger ones on
/// the blocking pool, so that a few megabyte-sized prompts cannot stall every other
/// request (`/health` included). A request with a `response_format` or forced tool
/// calls always goes there: the engine waits for its grammar to compile.
const INLINE_PREPARE_BYTES: usize = 16 * 1024;

/// Submits the generations `make(model)` builds for the routed model; when the backend
/// refuses them and the policy names a fallback for that, submits again to the fallback.
/// Every refusal that ends the request is settled on `routed`.
pub async fn submit(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: &(dyn Fn(&ModelSpec) -> Vec<GenerationRequest> + Sync),
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if !routed.is_routed() {
        // Resolved here once: the submits (and any retry) name the checkpoint itself.
        if let Some(checkpoint) = state.backend().pin_model(requested_model) {
            routed.pin(checkpoint);
        }
    }
    loop {
        let model = routed.backend_model(requested_model);
        match prepare_and_submit(state, routed, make(&model), prompt_field).await {
            Ok(choices) => return Ok(choices),
            Err(ApiError::Backend { source, .. }) if routed.fall_back(&source) => continue,
            Err(error) => {
                match &error {
                    ApiError::Backend { source, .. } => routed.failed(source, Usage::default()),
                    // Refused before anything ran: no spend, no usage record.
                    ApiError::Refused(_) => routed.release(),
                    _ => routed.cancelled(Usage::default()),
                }
                return Err(error);
            }
        }
    }
}

/// [`cover_and_submit`], off the async workers when the prompts are large: templating
/// and tokenizing them is CPU work proportional to their size.
async fn prepare_and_submit(
    state: &AppState,
    routed: &RoutedRequest,
    requests: Vec<GenerationRequest>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if !needs_blocking_pool(&requests) {
        return cover_and_submit(state, routed, requests, prompt_field);
    }
    // Waiting for a slot holds no thread; the slot is held until the work is done.
    let Ok(slot) = Arc::clone(state.heavy_prepares()).acquire_owned().await else {
        return Err(ApiError::backend(
            BackendError::Internal {
                message: "the preparation slots are closed".to_owned(),
            },
            prompt_field,
        ));
    };
    let state = state.clone();
    let routed = routed.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        cover_and_submit(&state, &routed, requests, prompt_field)
    })
    .await
    .unwrap_or_else(|failure| {
        Err(ApiError::backend(
            BackendError::Internal {
                message: format!("preparing the request failed: {failure}"),
            },
            prompt_field,
        ))
    })
}

/// Encodes the prompts on the routed checkpoint, holds the budget for their real size
/// ([`RoutedRequest::cover`]: refused before anything runs when it does not fit), then
/// submits the encoded prompts, so that the engine templates and tokenizes each once.
fn cover_and_submit(
    state: &AppState,
    routed: &RoutedRequest,
    mut requests: Vec<GenerationRequest>,
    prompt_field: &'static str,
) -> Result<Vec<Choice>, ApiError> {
    if routed.is_routed() {
        if let Some(counts) = encode_prompts(state, &mut requests, prompt_field)? {
            routed.cover(&counts)?;
        }
    }
    submit_all(state.backend(), requests, prompt_field)
}

/// Replaces each prompt with the backend's encoding of it and returns their token
/// counts (one per generation); `None` when the backend cannot encode before
/// submitting. The `n` generations of one prompt follow each other and are encoded once.
fn encode_prompts(
    state: &AppState,
    requests: &mut [GenerationRequest],
    prompt_field: &'static str,
) -> Result<Option<Vec<u32>>, ApiError> {
    let backend = state.backend();
    let mut counts = Vec::with_capacity(requests.len());
    let mut last: Option<(Prompt, Prompt)> = None;
    for request in requests.iter_mut() {
        if let Some((original, encoded)) = &last {
            if *original == request.prompt {
                request.prompt = encoded.clone();
                counts.push(counts.last().copied().unwrap_or(0));
                continue;
            }
        }
        let ids = match backend.encode_prompt(request) {
            None => return Ok(None),
            Some(result) => result.map_err(|error| ApiError::backend(error, prompt_field))?,
        };
        counts.push(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        let chat = matches!(request.prompt, Prompt::Chat(_));
        let encoded = Prompt::Encoded { ids, chat };
        let original = std::mem::replace(&mut request.prompt, encoded.clone());
        last = Some((original, encoded));
    }
    Ok(Some(counts))
}

/// Whether preparing `requests` is work for the blocking pool: a grammar to compile, or
/// more than [`INLINE_PREPARE_BYTES`] to template and tokenize.
fn needs_blocking_pool(requests: &[GenerationRequest]) -> bool {
    requests.iter().any(|request| request.constraint.is_some())
        || prompt_bytes(requests) > INLINE_PREPARE_BYTES
}

/// Bytes of prompt text (token ids count four each) and of the tool definitions the
/// template writes into it, over every generation.
fn prompt_bytes(requests: &[GenerationRequest]) -> usize {
    requests
        .iter()
        .map(|request| {
            let prompt = match &request.prompt {
                Prompt::Text(text) => text.len(),
                Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => ids.len() * 4,
                Prompt::Chat(messages) => messages.iter().map(|m| m.content.len()).sum(),
            };
            let tools: usize = request
                .tools
                .iter()
                .map(|tool| {
                    tool.name.len()
                        + tool.description.as_ref().map_or(0, String::len)
                        + tool.parameters.len()
                })
                .sum();
            prompt + tools
        })
        .sum()
}

/// Runs a whole-JSON request to its end: submits (with fallbacks), waits for every
/// generation, and on a failure before any output falls back again if the policy says
/// so. Settles `routed` with the usage of the whole request (`n` choices per prompt),
/// tallied once here and returned with the choices for the response body.
pub async fn finish_whole(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: &(dyn Fn(&ModelSpec) -> Vec<GenerationRequest> + Sync),
    prompt_field: &'static str,
    n: u32,
) -> Result<(Vec<Finished>, Usage), ApiError> {
    loop {
        let choices = submit(state, routed, requested_model, make, prompt_field).await?;
        match finish_all(choices).await {
            Ok(finished) => {
                let mut tally = UsageTally::new(n);
                for choice in &finished {
                    tally.add(choice.index, choice.usage);
                }
                let usage = tally.total();
                // Under a `[cascade]`, a too unsure answer goes to the next model.
                let confidence = least_confidence(&finished);
                if routed.defer_in_cascade(confidence, usage) {
                    continue;
                }
                routed.note_confidence(confidence);
                routed.succeeded(usage);
                return Ok((finished, usage));
            }
            Err(error) if routed.fall_back(&error) => continue,
            Err(error) => {
                routed.failed(&error, Usage::default());
                return Err(ApiError::backend(error, prompt_field));
            }
        }
    }
}

/// The events of a streamed request, settled as they pass ([`observe`]), and how many
/// generations they hold. Under a `[cascade]` the stream waits for the verdict: each
/// step before the last runs to its end unseen and is judged; an accepted answer is
/// replayed token by token, a deferred one dropped and the next model's streamed live.
pub async fn judged_stream(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: &(dyn Fn(&ModelSpec) -> Vec<GenerationRequest> + Sync),
    prompt_field: &'static str,
    n: u32,
) -> Result<(MergedEvents, u32), ApiError> {
    loop {
        let choices = submit(state, routed, requested_model, make, prompt_field).await?;
        let total = u32::try_from(choices.len()).unwrap_or(u32::MAX);
        if !routed.judged_in_cascade() {
            return Ok((observe(merge(choices), routed.clone(), total, n), total));
        }
        match finish_all(choices).await {
            Ok(finished) => {
                let mut tally = UsageTally::new(n);
                for choice in &finished {
                    tally.add(choice.index, choice.usage);
                }
                if routed.defer_in_cascade(least_confidence(&finished), tally.total()) {
                    continue;
                }
                return Ok((observe(replay(finished), routed.clone(), total, n), total));
            }
            Err(error) if routed.fall_back(&error) => continue,
            Err(error) => {
                routed.failed(&error, Usage::default());
                return Err(ApiError::backend(error, prompt_field));
            }
        }
    }
}

/// The confidence of the least sure choice; `None` when some choice measured none.
fn least_confidence(finished: &[Finished]) -> Option<TokenConfidence> {
    let mut all = finished.iter().map(|f| f.confidence);
    let first = all.next()??;
    all.try_fold(first, |least, next| {
        Some(TokenConfidence::least(least, next?))
    })
}

/// Wraps a streamed request's events so that the route is settled when the stream ends:
/// with the summed usage when every choice is done, as a failure on an error event, and
/// as a cancellation (tokens seen so far, the estimated prompt) when the client leaves.
pub fn observe(events: MergedEvents, routed: RoutedRequest, choices: u32, n: u32) -> MergedEvents {
    if !routed.is_routed() {
        return events;
    }
    let observed = Observed {
        events,
        routed,
        tally: UsageTally::new(n),
        remaining: choices,
        tokens_seen: 0,
        confidence: Confidence::Unseen,
        settled: false,
    };
    stream::select_all(vec![
        Box::pin(observed) as Pin<Box<dyn Stream<Item = (u32, GenerationEvent)> + Send>>
    ])
}

struct Observed {
    events: MergedEvents,
    routed: RoutedRequest,
    tally: UsageTally,
    remaining: u32,
    tokens_seen: u32,
    /// The least sure choice's confidence so far, as whole answers note it.
    confidence: Confidence,
    settled: bool,
}

/// The running least confidence of a streamed request's choices.
#[derive(Clone, Copy)]
enum Confidence {
    Unseen,
    Least(TokenConfidence),
    /// Some choice measured none.
    Unknown,
}

impl Confidence {
    fn add(self, next: Option<TokenConfidence>) -> Confidence {
        match (self, next) {
            (Confidence::Unknown, _) | (_, None) => Confidence::Unknown,
            (Confidence::Unseen, Some(c)) => Confidence::Least(c),
            (Confidence::Least(least), Some(c)) => {
                Confidence::Least(TokenConfidence::least(least, c))
            }
        }
    }
}

impl Observed {
    fn see(&mut self, index: u32, event: &GenerationEvent) {
        if self.settled {
            return;
        }
        match event {
            GenerationEvent::Token(_) => self.tokens_seen = self.tokens_seen.saturating_add(1),
            GenerationEvent::Done {
                usage, confidence, ..
            } => {
                self.tally.add(index, *usage);
                self.confidence = self.confidence.add(*confidence);
                self.remaining = self.remaining.saturating_sub(1);
                if self.remaining == 0 {
                    self.settled = true;
                    if let Confidence::Least(least) = self.confidence {
                        self.routed.note_confidence(Some(least));
                    }
                    self.routed.succeeded(self.tally.total());
                }
            }
            GenerationEvent::Error(error) => {
                self.settled = true;
                let usage = self.partial_usage();
                self.routed.failed(error, usage);
            }
        }
    }

    /// Usage of an unfinished request: finished choices as counted, the prompt estimate
    /// when none finished, and every token seen.
    fn partial_usage(&self) -> Usage {
        let counted = self.tally.total();
        Usage {
            prompt_tokens: counted
                .prompt_tokens
                .max(self.routed.estimated_prompt_tokens()),
            cached_tokens: counted.cached_tokens,
            completion_tokens: self.tokens_seen,
        }
    }
}

impl Stream for Observed {
    type Item = (u32, GenerationEvent);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.events).poll_next(cx);
        match &polled {
            Poll::Ready(Some((index, event))) => this.see(*index, event),
            Poll::Ready(None) if !this.settled => {
                this.settled = true;
                let usage = this.partial_usage();
                this.routed.failed(
                    &BackendError::Internal {
                        message: "the generation stream ended before every choice finished"
                            .to_owned(),
                    },
                    usage,
                );
            }
            _ => {}
        }
        polled
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if !self.settled {
            let usage = self.partial_usage();
            self.routed.cancelled(usage);
        }
    }
}
