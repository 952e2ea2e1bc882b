//! A whole-JSON answer: wait for every choice, retry on the policy's fallback or the
//! cascade's next model, then settle the route with the request's usage.

use crate::error::ApiError;
use crate::openai::tail::choice::Choice;
use crate::openai::tail::settle::UsageTally;
use crate::openai::tail::submit::{submit, MakeRequests};
use crate::policy::cascade::Evidence;
use crate::policy::RoutedRequest;
use crate::state::AppState;
use switchyard_seam::{
    BackendError, FinishReason, GeneratedToken, GenerationEvent, ModelSpec, TokenConfidence, Usage,
};

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
pub async fn finish(choice: Choice) -> Result<Finished, BackendError> {
    finish_after(choice, None).await
}

/// Waits for one choice to finish whose first event, `head`, was already read.
pub async fn finish_after(
    mut choice: Choice,
    mut head: Option<GenerationEvent>,
) -> Result<Finished, BackendError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        let event = match head.take() {
            Some(event) => event,
            None => choice.next_event().await,
        };
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
}

/// Waits for every choice, concurrently. The first failure drops (cancels) the rest.
pub async fn finish_all(choices: Vec<Choice>) -> Result<Vec<Finished>, BackendError> {
    futures_util::future::try_join_all(choices.into_iter().map(finish)).await
}

/// Runs a whole-JSON request to its end: submits (with fallbacks), waits for every
/// generation, and on a failure before any output falls back again if the policy says
/// so. Settles `routed` with the usage of the whole request (`n` choices per prompt),
/// tallied once here and returned with the choices for the response body.
pub async fn finish_whole(
    state: &AppState,
    routed: &RoutedRequest,
    requested_model: &ModelSpec,
    make: MakeRequests<'_>,
    prompt_field: &'static str,
    n: u32,
) -> Result<(Vec<Finished>, Usage), ApiError> {
    loop {
        let choices = submit(state, routed, requested_model, make, prompt_field).await?;
        match finish_all(choices).await {
            Ok(finished) => {
                let usage = usage_of(&finished, n);
                // Under a `[cascade]`, a too unsure answer goes to the next model.
                if judge_finished(routed, &finished, usage) {
                    continue;
                }
                routed.note_confidence(least_confidence(&finished));
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

/// Judges a cascade step's finished answers (when the step is judged): true when the
/// request is to be submitted again, because it was deferred to the next model, or
/// because the engine stopped it after its first token and it was not deferred after all
/// (the next model could not take it, or the policy changed in between): then it is
/// asked again in full (its prompt mostly from the prompt cache), unjudged.
pub fn judge_finished(routed: &RoutedRequest, finished: &[Finished], usage: Usage) -> bool {
    let stopped_early = finished
        .iter()
        .any(|f| f.finish_reason == FinishReason::Unsure);
    let evidence = Evidence::Answer(least_confidence(finished));
    if let Some(verdict) = routed.judge_in_cascade(evidence) {
        if routed.defer_in_cascade(verdict, usage, stopped_early) {
            return true;
        }
    }
    if stopped_early {
        routed.settle_cascade();
        return true;
    }
    false
}

/// The request's usage from its finished choices, `n` per prompt.
pub fn usage_of(finished: &[Finished], n: u32) -> Usage {
    let mut tally = UsageTally::new(n);
    for choice in finished {
        tally.add(choice.index, choice.usage);
    }
    tally.total()
}

/// The confidence of the least sure choice; `None` when some choice measured none.
pub fn least_confidence(finished: &[Finished]) -> Option<TokenConfidence> {
    let mut all = finished.iter().map(|f| f.confidence);
    let first = all.next()??;
    all.try_fold(first, |least, next| {
        Some(TokenConfidence::least(least, next?))
    })
}
