//! A streamed answer: turns a request's merged generation events into OpenAI's
//! server-sent chunk stream, ending in `data: [DONE]`, and settles the route as the
//! stream ends ([`Settlement`]).
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
use crate::openai::tail::choice::{merge, Choice, MergedEvents};
use crate::openai::tail::settle::Settlement;
use crate::policy::RoutedRequest;
use switchyard_seam::{BackendError, FinishReason, GeneratedToken, GenerationEvent, Usage};

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

/// The SSE response for `choices`, shaped by `format`; settles `routed` when it ends.
pub fn stream_response<F: ChunkFormat>(
    choices: Vec<Choice>,
    routed: RoutedRequest,
    mut format: F,
    settings: StreamSettings,
) -> Response {
    let total = u32::try_from(choices.len()).unwrap_or(u32::MAX);
    let pending = (0..total)
        .filter_map(|index| format.opening(index))
        .map(|chunk| sse_json_event(&chunk))
        .collect();
    let driver = Driver {
        events: merge(choices),
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
