//! One running generation and its place in the response ([`Choice`]), and the merged
//! events of a request's choices ([`merge`]).
//!
//! A [`Choice`] owns its [`GenerationStream`]; dropping a choice, or the merged stream
//! holding it, cancels that generation in the engine.

use std::pin::Pin;
use std::time::Instant;

use futures_util::stream::{self, SelectAll, Stream, StreamExt};

use crate::error::ApiError;
use crate::metrics::GenerationMetrics;
use switchyard_seam::{
    BackendError, GenerationEvent, GenerationRequest, GenerationStream, InferenceBackend,
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
    /// The next event; the last one is `Done` or `Error`. A stream that closes without
    /// saying how it ended yields an `Internal` error: this is the one place a
    /// generation that ended early is noticed, so every reader of a choice (whole or
    /// streamed) sees each choice end with `Done` or `Error`.
    pub async fn next_event(&mut self) -> GenerationEvent {
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
        event
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

/// The events of every choice as they come, tagged with the choice index. Each
/// choice's events end with its `Done` or `Error`.
pub type MergedEvents = SelectAll<Pin<Box<dyn Stream<Item = (u32, GenerationEvent)> + Send>>>;

/// Merges the choices' events into one stream that owns the choices.
pub fn merge(choices: Vec<Choice>) -> MergedEvents {
    stream::select_all(
        choices
            .into_iter()
            .map(|choice| Box::pin(events_of(choice)) as Pin<Box<dyn Stream<Item = _> + Send>>),
    )
}

/// Merges choices whose first event (`head`, each) was already read: each choice's
/// head, then its events as they come.
pub fn merge_after(heads: Vec<(Choice, GenerationEvent)>) -> MergedEvents {
    stream::select_all(heads.into_iter().map(|(choice, head)| {
        let first = stream::iter([(choice.index, head)]);
        Box::pin(first.chain(events_of(choice))) as Pin<Box<dyn Stream<Item = _> + Send>>
    }))
}

/// A choice's remaining events, tagged with its index; nothing once it finished.
fn events_of(choice: Choice) -> impl Stream<Item = (u32, GenerationEvent)> + Send {
    stream::unfold(choice, |mut choice| async move {
        if choice.finished {
            return None;
        }
        let event = choice.next_event().await;
        Some(((choice.index, event), choice))
    })
}
