//! A whole-JSON answer: wait for every choice, retry on the policy's fallback or the
//! cascade's next model, then settle the route with the request's usage.

use crate::error::ApiError;
use crate::openai::tail::finished::{finish_all, Finished};
use crate::openai::tail::handoff::{self, Handoff};
use crate::openai::tail::settle::UsageTally;
use crate::openai::tail::submit::{submit, MakeRequests};
use crate::policy::cascade::Evidence;
use crate::policy::RoutedRequest;
use crate::state::AppState;
use switchyard_seam::{FinishReason, ModelSpec, TokenConfidence, Usage};

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
    // Under a `[cascade]` with a handoff: the deferred answer's sure part, which the
    // next model continues.
    let mut handoff: Option<Handoff> = None;
    loop {
        let continuing = |model: &ModelSpec| handoff::requests(make, model, handoff.as_ref());
        let choices = submit(state, routed, requested_model, &continuing, prompt_field).await?;
        match finish_all(choices).await {
            Ok(mut finished) => {
                if let Some(kept) = &handoff {
                    kept.prepend(&mut finished);
                }
                let usage = usage_of(&finished, n);
                // Under a `[cascade]`, a too unsure answer goes to the next model.
                match judge_finished(routed, &finished, usage) {
                    Next::Stands => {}
                    Next::Again => continue,
                    Next::HandOff(next) => {
                        handoff = Some(next);
                        continue;
                    }
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

/// What follows a cascade step's finished answers.
#[derive(Debug)]
pub enum Next {
    /// The answers stand.
    Stands,
    /// Submit again: deferred to the next model, which answers from scratch, or stopped
    /// early by the engine and not deferred after all (asked again in full, unjudged).
    Again,
    /// Deferred to the next model, which continues the answers' sure part.
    HandOff(Handoff),
}

/// Judges a cascade step's finished answers (when the step is judged). Deferred, the
/// request goes to the next model: handed off ([`Handoff`]) when the policy says so and
/// some choice has a token below the threshold, otherwise from scratch.
/// An answer the engine stopped early that is not deferred after all (the next model
/// could not take it, or the policy changed in between) is asked again in full (its
/// prompt mostly from the prompt cache), unjudged.
pub fn judge_finished(routed: &RoutedRequest, finished: &[Finished], usage: Usage) -> Next {
    let stopped_early = finished
        .iter()
        .any(|f| f.finish_reason == FinishReason::Unsure);
    let evidence = Evidence::Answer(least_confidence(finished));
    // Read before the verdict: a deferral moves the request to the next step.
    let handoff_stop = routed
        .hands_off_in_cascade()
        .then(|| routed.unsure_stop())
        .flatten();
    if let Some(verdict) = routed.judge_in_cascade(evidence) {
        let handoff = handoff_stop.and_then(|stop| Handoff::of(finished, &stop));
        let kept = handoff.as_ref().map(Handoff::kept_counts);
        if routed.defer_in_cascade(verdict, usage, stopped_early, kept.as_deref()) {
            return handoff.map_or(Next::Again, Next::HandOff);
        }
    }
    if stopped_early {
        routed.settle_cascade();
        return Next::Again;
    }
    Next::Stands
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
