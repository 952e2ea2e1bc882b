//! A request's usage, tallied once, and its route, settled once, whichever way its
//! answer ends.

use crate::policy::RoutedRequest;
use switchyard_seam::{GenerationEvent, TokenConfidence, Usage};

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

/// A streamed answer's end, seen event by event: tallies each choice's usage and
/// confidence as it finishes and settles the route once: with the request's usage (and
/// the least sure choice's confidence, as whole answers note it) when the last choice
/// is done, as a failure on an error event, and as a cancellation (tokens seen so far,
/// the estimated prompt) when the answer stops any other way (the client left, the
/// server's drain deadline passed).
pub struct Settlement {
    routed: RoutedRequest,
    tally: UsageTally,
    remaining: u32,
    tokens_seen: u32,
    confidence: Confidence,
    settled: bool,
}

/// The running least confidence of a streamed request's choices.
#[derive(Debug, Clone, Copy)]
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

impl Settlement {
    /// The settlement of `routed`'s answer of `choices` choices, `n` per prompt.
    pub fn new(routed: RoutedRequest, choices: u32, n: u32) -> Self {
        Settlement {
            routed,
            tally: UsageTally::new(n),
            remaining: choices,
            tokens_seen: 0,
            confidence: Confidence::Unseen,
            settled: false,
        }
    }

    /// Notes `event` of choice `index`; returns the request's usage when it was the
    /// last choice's `Done` (the route is then settled as a success).
    pub fn see(&mut self, index: u32, event: &GenerationEvent) -> Option<Usage> {
        if self.settled {
            return None;
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
                    let usage = self.tally.total();
                    self.routed.succeeded(usage);
                    return Some(usage);
                }
            }
            GenerationEvent::Error(error) => {
                self.settled = true;
                self.routed.failed(error, self.partial_usage());
            }
        }
        None
    }

    /// The answer stopped before it ended (see [`Settlement`]); nothing once settled.
    pub fn cancel(&mut self) {
        if !self.settled {
            self.settled = true;
            self.routed.cancelled(self.partial_usage());
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

impl Drop for Settlement {
    fn drop(&mut self) {
        self.cancel();
    }
}
