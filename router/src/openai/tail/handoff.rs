//! The cascade's handoff (`handoff = true` under `min_margin`): a deferred answer the
//! engine stopped at its first unsure token is not thrown away. The next model is given
//! the prompt and the answer's sure part (every token before the unsure one) as the
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
use switchyard_seam::{
    FinishReason, GeneratedToken, GenerationEvent, GenerationRequest, ModelSpec,
};

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
    /// The handoff of `finished` (every choice of one answer, in order) when the engine
    /// stopped each choice at its first unsure token (`FinishReason::Unsure`): each keeps
    /// its tokens before that one. `None` when some choice ended otherwise (it has no
    /// unsure token to continue from): the deferral starts the answer from scratch.
    pub fn of(finished: &[Finished]) -> Option<Handoff> {
        let stopped = |f: &Finished| f.finish_reason == FinishReason::Unsure;
        if finished.is_empty() || !finished.iter().all(stopped) {
            return None;
        }
        let kept = finished
            .iter()
            .map(|f| {
                let sure = f.tokens.len().saturating_sub(1);
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
    /// text, and takes the kept tokens off its `max_tokens` (the unsure token was one of
    /// them too, so at least one is left).
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
    use switchyard_seam::{Prompt, Usage};

    fn token(text: &str, id: u32) -> GeneratedToken {
        GeneratedToken {
            text: text.to_owned(),
            id,
            logprob: None,
            top_logprobs: Vec::new(),
            margin: None,
        }
    }

    fn finished(index: u32, texts: &[&str], finish_reason: FinishReason) -> Finished {
        Finished {
            index,
            text: texts.concat(),
            tokens: (0u32..).zip(texts).map(|(id, t)| token(t, id)).collect(),
            finish_reason,
            usage: Usage::default(),
            confidence: None,
        }
    }

    #[test]
    fn keeps_the_tokens_before_the_unsure_one_and_continues_after_them() {
        let stopped = [finished(
            0,
            &[" The", " letter", " q"],
            FinishReason::Unsure,
        )];
        let handoff = Handoff::of(&stopped).expect("every choice stopped unsure");
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
        let mut answer = [finished(0, &[" b", "."], FinishReason::Stop)];
        handoff.prepend(&mut answer);
        assert_eq!(answer[0].text, " The letter b.");
        let texts: Vec<&str> = answer[0].tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, [" The", " letter", " b", "."]);
    }

    #[test]
    fn an_answer_that_ended_otherwise_starts_again_from_scratch() {
        let mixed = [
            finished(0, &[" a", " b"], FinishReason::Unsure),
            finished(1, &[" c"], FinishReason::Stop),
        ];
        assert_eq!(Handoff::of(&mixed), None);
        assert_eq!(Handoff::of(&[]), None);
        // An answer unsure at its first token keeps nothing: no prefix is written.
        let first =
            Handoff::of(&[finished(0, &[" x"], FinishReason::Unsure)]).expect("stopped unsure");
        assert_eq!(first.kept_counts(), vec![0]);
    }
}
