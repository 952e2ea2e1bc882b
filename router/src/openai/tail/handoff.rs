//! The cascade's handoff (`handoff = true` under `min_margin`): a deferred answer is not
//! thrown away. The engine stopped it at its first unsure token (or it ended there); the
//! next model is given the prompt and the answer's sure part (every token before the
//! unsure one) as the
//! start of its answer ([`GenerationRequest::answer_prefix`]) and continues it; the
//! response is the kept part followed by the continuation. A whole answer gets the kept
//! text and tokens in front of the continuation's; a stream sends the kept tokens first
//! (replayed, as the first model generated them), then the continuation as it comes.
//!
//! The kept tokens count against the request's `max_tokens`: the continuation may
//! generate what is left. `usage` is the answering model's (its `prompt_tokens` count
//! the kept text, which it read as its prompt's end; `completion_tokens` its
//! continuation); the first model's attempt, kept tokens included, is billed as its own
//! deferred attempt.

use futures_util::stream::{self, StreamExt};
use switchyard_seam::{GeneratedToken, GenerationEvent, GenerationRequest, ModelSpec, UnsureStop};

use crate::openai::tail::choice::{merge, Choice, MergedEvents};
use crate::openai::tail::finished::Finished;
use crate::openai::tail::submit::MakeRequests;

/// The sure part of each choice of a deferred answer, which the next model continues.
#[derive(Debug, Clone, PartialEq)]
pub struct Handoff {
    /// One per choice, in choice order (a choice's index is its position).
    kept: Vec<Vec<GeneratedToken>>,
}

impl Handoff {
    /// The handoff of `finished` (every choice of one answer, in order) judged by `stop`
    /// (the cascade's unsure stop): each choice keeps its tokens before its first token
    /// `stop` finds too unsure. That is the token the engine stopped it at, or, when it
    /// ended at the same token for another reason (the unsure token was the line break a
    /// stop string matched, or the end of the sequence), that last one: then the whole
    /// answer is kept and the next model continues after it. A choice without an unsure
    /// token keeps all of it. `None` when no choice has one (no tokens, or no margins
    /// measured): the deferral starts the answer from scratch.
    pub fn of(finished: &[Finished], stop: &UnsureStop) -> Option<Handoff> {
        let unsure = |f: &Finished| {
            f.tokens
                .iter()
                .position(|t| t.margin.is_some_and(|m| stop.stops(&m)))
        };
        if !finished.iter().any(|f| unsure(f).is_some()) {
            return None;
        }
        let kept = finished
            .iter()
            .map(|f| {
                let sure = unsure(f).unwrap_or(f.tokens.len());
                f.tokens.get(..sure).unwrap_or_default().to_vec()
            })
            .collect();
        Some(Handoff { kept })
    }

    /// How many tokens each choice keeps, for headers and metrics.
    pub fn kept_counts(&self) -> Vec<usize> {
        self.kept.iter().map(Vec::len).collect()
    }

    /// Sets each request's [`GenerationRequest::answer_prefix`] to its choice's kept
    /// text, and takes the kept tokens off its `max_tokens` (at least one is left to
    /// continue with).
    pub fn apply(&self, requests: &mut [GenerationRequest]) {
        for (request, kept) in requests.iter_mut().zip(&self.kept) {
            let text = kept_text(kept);
            request.answer_prefix = (!text.is_empty()).then_some(text);
            let used = u32::try_from(kept.len()).unwrap_or(u32::MAX);
            request.max_tokens = request.max_tokens.map(|m| m.saturating_sub(used).max(1));
        }
    }

    /// Puts each choice's kept text and tokens in front of its continuation.
    pub fn prepend(&self, finished: &mut [Finished]) {
        for choice in finished.iter_mut() {
            let Some(kept) = self.kept_of(choice.index) else {
                continue;
            };
            choice.text.insert_str(0, &kept_text(kept));
            choice.tokens.splice(0..0, kept.iter().cloned());
        }
    }

    /// The continuation's `choices` as one stream that starts with each choice's kept
    /// tokens (replayed), then its continuation's events as they come.
    pub fn stream(&self, choices: Vec<Choice>) -> MergedEvents {
        let mut events = merge(Vec::new());
        for choice in choices {
            let index = choice.index;
            let kept: Vec<(u32, GenerationEvent)> = self
                .kept_of(index)
                .map(|kept| {
                    kept.iter()
                        .map(|token| (index, GenerationEvent::Token(token.clone())))
                        .collect()
                })
                .unwrap_or_default();
            let live = merge(vec![choice]);
            events.push(Box::pin(stream::iter(kept).chain(live)));
        }
        events
    }

    fn kept_of(&self, index: u32) -> Option<&Vec<GeneratedToken>> {
        self.kept.get(usize::try_from(index).ok()?)
    }
}

/// `make(model)`'s requests, continuing `handoff`'s kept answers when there is one.
pub fn requests(
    make: MakeRequests<'_>,
    model: &ModelSpec,
    handoff: Option<&Handoff>,
) -> Vec<GenerationRequest> {
    let mut requests = make(model);
    if let Some(handoff) = handoff {
        handoff.apply(&mut requests);
    }
    requests
}

/// The text of `tokens`, as the client saw it.
fn kept_text(tokens: &[GeneratedToken]) -> String {
    tokens.iter().map(|t| t.text.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_seam::{FinishReason, MarginStatistic, Prompt, TokenMargin, Usage};

    const STOP: UnsureStop = UnsureStop {
        statistic: MarginStatistic::Margin,
        min: 0.5,
        every_token: true,
    };

    /// A token; `unsure`: its margin is below [`STOP`]'s threshold.
    fn token(text: &str, id: u32, unsure: bool) -> GeneratedToken {
        GeneratedToken {
            text: text.to_owned(),
            id,
            logprob: None,
            top_logprobs: Vec::new(),
            margin: Some(TokenMargin {
                margin: if unsure { 0.25 } else { 2.0 },
                entropy: 0.5,
            }),
        }
    }

    /// A choice of `texts`, the token at `unsure` (if any) too unsure.
    fn finished(
        index: u32,
        texts: &[&str],
        unsure: Option<usize>,
        reason: FinishReason,
    ) -> Finished {
        Finished {
            index,
            text: texts.concat(),
            tokens: (0u32..)
                .zip(texts)
                .map(|(id, t)| token(t, id, unsure == Some(id as usize)))
                .collect(),
            finish_reason: reason,
            usage: Usage::default(),
            confidence: None,
        }
    }

    #[test]
    fn keeps_the_tokens_before_the_unsure_one_and_continues_after_them() {
        let stopped = [finished(
            0,
            &[" The", " letter", " q"],
            Some(2),
            FinishReason::Unsure,
        )];
        let handoff = Handoff::of(&stopped, &STOP).expect("a choice has an unsure token");
        assert_eq!(handoff.kept_counts(), vec![2]);
        let mut requests = vec![GenerationRequest {
            request_id: "r".to_owned(),
            model: ModelSpec::Active("strong".to_owned()),
            prompt: Prompt::Text("Q:".to_owned()),
            max_tokens: Some(8),
            sampling: Default::default(),
            stop: Vec::new(),
            logprobs: None,
            user: None,
            tools: Vec::new(),
            constraint: None,
            cache_scope: Default::default(),
            share: Default::default(),
            fanout: 1,
            deadline: None,
            stop_unsure: None,
            answer_prefix: None,
        }];
        handoff.apply(&mut requests);
        assert_eq!(requests[0].answer_prefix.as_deref(), Some(" The letter"));
        assert_eq!(requests[0].max_tokens, Some(6), "8 asked, 2 kept");
        let mut answer = [finished(0, &[" b", "."], None, FinishReason::Stop)];
        handoff.prepend(&mut answer);
        assert_eq!(answer[0].text, " The letter b.");
        let texts: Vec<&str> = answer[0].tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, [" The", " letter", " b", "."]);
    }

    #[test]
    fn an_answer_unsure_only_at_its_end_is_kept_whole() {
        // The line break a stop string matched was the unsure token: the engine ended
        // the answer there as `Stop` (its text held back), and all of it is kept.
        let ended = [finished(0, &[" a", " b.", ""], Some(2), FinishReason::Stop)];
        let handoff = Handoff::of(&ended, &STOP).expect("the last token is unsure");
        assert_eq!(handoff.kept_counts(), vec![2]);
        // Several choices: each keeps its own sure part; one without an unsure token
        // keeps all of it.
        let two = [
            finished(0, &[" a", " b"], Some(1), FinishReason::Unsure),
            finished(1, &[" c", " d"], None, FinishReason::Stop),
        ];
        let handoff = Handoff::of(&two, &STOP).expect("a choice has an unsure token");
        assert_eq!(handoff.kept_counts(), vec![1, 2]);
    }

    #[test]
    fn without_an_unsure_token_the_next_model_starts_from_scratch() {
        let sure = [finished(0, &[" a", " b"], None, FinishReason::Stop)];
        assert_eq!(Handoff::of(&sure, &STOP), None);
        assert_eq!(Handoff::of(&[], &STOP), None);
        // An answer unsure at its first token keeps nothing: no prefix is written.
        let first = Handoff::of(
            &[finished(0, &[" x"], Some(0), FinishReason::Unsure)],
            &STOP,
        )
        .expect("stopped unsure");
        assert_eq!(first.kept_counts(), vec![0]);
    }
}
