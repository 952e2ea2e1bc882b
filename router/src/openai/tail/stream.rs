//! A streamed answer: turns a request's merged generation events into OpenAI's
//! server-sent chunk stream, ending in `data: [DONE]`, and settles the route as the
//! stream ends ([`Settlement`]).
//!
//! Under a `[cascade]` the stream waits for the verdict ([`judged_stream`]), and the
//! stream (headers included, so `x-switchyard-cascade` is known) starts once it is: a
//! step judged by its first token waits for that token, then streams on live; a step
//! judged by its whole answer runs to its end unseen, and the accepted answer's tokens
//! are replayed as they were generated. A deferred step gives way to the next model's
//! answer, streamed as it comes; handed off ([`Handoff`]), the stream sends the kept
//! tokens first, then the next model's continuation as it comes.
//!
//! The SSE body owns the [`MergedEvents`], which own every generation
//! stream: when the client goes away, hyper drops the body, and with it the
//! receivers, which tells the engine to cancel.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use serde::Serialize;

use crate::error::{sse_json_event, ApiError};
use crate::openai::tail::choice::{merge, merge_after, Choice, MergedEvents};
use crate::openai::tail::finished::{finish_after, finish_all, Finished};
use crate::openai::tail::handoff::{self, Handoff};
use crate::openai::tail::settle::Settlement;
use crate::openai::tail::submit::{submit, MakeRequests};
use crate::openai::tail::whole::{judge_finished, usage_of, Next};
use crate::policy::cascade::Evidence;
use crate::policy::RoutedRequest;
use crate::state::AppState;
use switchyard_seam::{
    BackendError, FinishReason, GeneratedToken, GenerationEvent, ModelSpec, TokenMargin, Usage,
};

/// How one endpoint shapes its chunks.
pub trait ChunkFormat: Send + 'static {
    /// The chunk type.
    type Chunk: Serialize;

    /// A choice's first chunk, sent before any token (chat: the role).
    fn opening(&mut self, index: u32) -> Option<Self::Chunk>;
    /// The chunks for one token: none when there is no new text, several
    /// when the token completes more than one piece (a tool call's parts).
    fn token(&mut self, index: u32, token: &GeneratedToken) -> Vec<Self::Chunk>;
    /// A choice's last chunks: any text held back to the end, then the one
    /// carrying `finish_reason`.
    fn finish(&mut self, index: u32, reason: FinishReason) -> Vec<Self::Chunk>;
    /// The usage chunk after every choice finished (`include_usage`).
    fn usage(&mut self, usage: Usage) -> Self::Chunk;
}

/// What a streamed response needs besides its events.
#[derive(Debug, Clone, Copy)]
pub struct StreamSettings {
    /// Choices per prompt, for the usage tally.
    pub n: u32,
    /// Send a final usage chunk.
    pub include_usage: bool,
    /// Where the prompt is in the request, for error params.
    pub prompt_field: &'static str,
    /// Interval of keep-alive comments.
    pub keep_alive: Duration,
}

struct Driver<F> {
    events: MergedEvents,
    format: F,
    settings: StreamSettings,
    pending: VecDeque<Event>,
    settlement: Settlement,
    ended: bool,
    /// Turns `true` when the server's drain deadline passes (see [`crate::drain`]).
    deadline_passed: Option<tokio::sync::watch::Receiver<bool>>,
}

impl<F: ChunkFormat> Driver<F> {
    fn push<T: Serialize>(&mut self, chunk: &T) {
        self.pending.push_back(sse_json_event(chunk));
    }

    fn fail(&mut self, error: BackendError) {
        let error = ApiError::backend(error, self.settings.prompt_field);
        tracing::warn!(%error, "generation failed mid-stream");
        self.pending.push_back(error.sse_event());
        self.end();
    }

    /// Stops listening: drops (cancels) every remaining generation, and settles the
    /// route as cancelled unless the answer ended.
    fn end(&mut self) {
        self.ended = true;
        self.events = stream::select_all(Vec::new());
        self.settlement.cancel();
    }

    fn handle(&mut self, index: u32, event: GenerationEvent) {
        let finished = self.settlement.see(index, &event);
        match event {
            GenerationEvent::Token(token) => {
                for chunk in self.format.token(index, &token) {
                    self.push(&chunk);
                }
            }
            GenerationEvent::Done { finish_reason, .. } => {
                for chunk in self.format.finish(index, finish_reason) {
                    self.push(&chunk);
                }
                if let Some(usage) = finished {
                    if self.settings.include_usage {
                        let chunk = self.format.usage(usage);
                        self.push(&chunk);
                    }
                    self.pending.push_back(Event::default().data("[DONE]"));
                    self.end();
                }
            }
            GenerationEvent::Error(error) => self.fail(error),
        }
    }

    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            let events = &mut self.events;
            let next = match self.deadline_passed.as_mut() {
                Some(passed) => tokio::select! {
                    biased;
                    next = events.next() => Some(next),
                    () = crate::drain::passed(passed) => None,
                },
                None => Some(events.next().await),
            };
            let Some(next) = next else {
                // The server is going away: say so, then stop (cancelling the work).
                self.deadline_passed = None;
                self.pending.push_back(ApiError::ShuttingDown.sse_event());
                self.end();
                continue;
            };
            match next {
                Some((index, event)) => self.handle(index, event),
                // Unreached: each choice's events end with its `Done` or `Error`
                // (`Choice::next_event`), and the driver ends at the first `Error` and at
                // the last `Done`.
                None => self.end(),
            }
        }
    }
}

/// The events of a streamed request and how many generations they hold: submitted
/// (with the policy's fallbacks), and under a `[cascade]` judged before anything is
/// sent. A step judged by its first token is judged on it: accepted, its tokens stream
/// on live; deferred (the engine stopped it there), the next model's stream. A step
/// judged by its whole answer runs to its end unseen: accepted, it is replayed token by
/// token; deferred, dropped and the next model's answer streamed live.
pub async fn judged_stream(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: MakeRequests<'_>,
    prompt_field: &'static str,
    n: u32,
) -> Result<(MergedEvents, u32), ApiError> {
    // A deferred answer's sure part, which the next model continues ([`Handoff`]).
    let mut handoff: Option<Handoff> = None;
    loop {
        let continuing = |model: &ModelSpec| handoff::requests(make, model, handoff.as_ref());
        let choices = submit(state, routed, requested_model, &continuing, prompt_field).await?;
        let total = u32::try_from(choices.len()).unwrap_or(u32::MAX);
        if !routed.judged_in_cascade() {
            // Handed off: the kept tokens first, then the continuation live.
            let events = match &handoff {
                Some(kept) => kept.stream(choices),
                None => merge(choices),
            };
            return Ok((events, total));
        }
        let judged = if routed.judged_on_first_token() {
            judge_first_tokens(routed, choices, n).await
        } else {
            finish_all(choices).await.map(|mut finished| {
                if let Some(kept) = &handoff {
                    kept.prepend(&mut finished);
                }
                judged_answers(routed, finished, n)
            })
        };
        match judged {
            Ok(Judged::Stands(events)) => return Ok((events, total)),
            Ok(Judged::Again) => continue,
            Ok(Judged::HandOff(next)) => handoff = Some(next),
            Err(error) if routed.fall_back(&error) => continue,
            Err(error) => {
                routed.failed(&error, Usage::default());
                return Err(ApiError::backend(error, prompt_field));
            }
        }
    }
}

/// What judging a cascade step's stream decided.
enum Judged {
    /// These events are the answer.
    Stands(MergedEvents),
    /// Submit again (to the next model, or in full).
    Again,
    /// Submit to the next model, which continues this sure part.
    HandOff(Handoff),
}

/// Judges finished answers ([`judge_finished`]); the answer that stands is replayed.
fn judged_answers(routed: &RoutedRequest, finished: Vec<Finished>, n: u32) -> Judged {
    match judge_finished(routed, &finished, usage_of(&finished, n)) {
        Next::Stands => Judged::Stands(replay(finished)),
        Next::Again => Judged::Again,
        Next::HandOff(handoff) => Judged::HandOff(handoff),
    }
}

/// Judges a step by its choices' first tokens (the least decided one's margin): the
/// stream waits for one token, not the whole answer. Deferred, the choices run to
/// their end (the engine stopped the unsure ones after that token) for the attempt's
/// usage, and are judged as finished answers by the same numbers.
async fn judge_first_tokens(
    routed: &RoutedRequest,
    choices: Vec<Choice>,
    n: u32,
) -> Result<Judged, BackendError> {
    let mut heads = Vec::with_capacity(choices.len());
    for mut choice in choices {
        match choice.next_event().await {
            GenerationEvent::Error(error) => return Err(error),
            head => heads.push((choice, head)),
        }
    }
    let mut least: Option<TokenMargin> = None;
    let mut measured = true;
    for (_, head) in &heads {
        match head {
            GenerationEvent::Token(GeneratedToken {
                margin: Some(margin),
                ..
            }) => least = Some(least.map_or(*margin, |l| TokenMargin::least(l, *margin))),
            // No token (the answer ended at once), or none measured: deferred.
            _ => measured = false,
        }
    }
    let margin = least.filter(|_| measured);
    if routed
        .judge_in_cascade(Evidence::FirstToken(margin))
        .is_none()
    {
        return Ok(Judged::Stands(merge_after(heads)));
    }
    let finished = futures_util::future::try_join_all(
        heads
            .into_iter()
            .map(|(choice, head)| finish_after(choice, Some(head))),
    )
    .await?;
    Ok(judged_answers(routed, finished, n))
}

/// The events of generations that already ran to their end, as they came: each
/// choice's tokens, then its `Done`, one choice after another.
fn replay(finished: Vec<Finished>) -> MergedEvents {
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
        Box::pin(stream::iter(events))
            as std::pin::Pin<Box<dyn futures_util::Stream<Item = _> + Send>>
    }))
}

/// The SSE response for `events` (of `total` choices), shaped by `format`; settles
/// `routed` when it ends.
pub fn stream_response<F: ChunkFormat>(
    events: MergedEvents,
    total: u32,
    routed: RoutedRequest,
    mut format: F,
    settings: StreamSettings,
) -> Response {
    let pending = (0..total)
        .filter_map(|index| format.opening(index))
        .map(|chunk| sse_json_event(&chunk))
        .collect();
    let driver = Driver {
        events,
        format,
        settings,
        pending,
        settlement: Settlement::new(routed, total, settings.n),
        ended: total == 0,
        deadline_passed: crate::drain::current(),
    };
    let body = stream::unfold(driver, |mut driver| async move {
        let event = driver.next().await?;
        Some((Ok::<Event, Infallible>(event), driver))
    });
    Sse::new(body)
        .keep_alive(KeepAlive::new().interval(settings.keep_alive))
        .into_response()
}
