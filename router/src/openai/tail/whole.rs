//! A whole-JSON answer: wait for every choice, retry on the policy's fallback or the
//! cascade's next model, then settle the route with the request's usage.

use crate::error::ApiError;
use crate::openai::tail::choice::Choice;
use crate::openai::tail::settle::UsageTally;
use crate::openai::tail::submit::{submit, MakeRequests};
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
pub async fn finish(mut choice: Choice) -> Result<Finished, BackendError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        match choice.next_event().await {
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
