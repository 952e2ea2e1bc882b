//! Admission by KV blocks.
//!
//! A sequence's cache reserves from the backend's KV budget every block it
//! may hold (prompt + `max_tokens`, or the whole context without
//! `max_tokens`) when it is made, and gives them back when the sequence
//! ends. So the budget decides admission up front: a request whose cache
//! could never fit is refused at submit with a 4xx naming what to change;
//! one that fits the budget but not what is free now waits in the queue
//! until running sequences end; a running sequence never runs out.

use switchyard_kernels::{Backend, KernelError, KvPrefix};

use super::queue::{kv_positions, KvAdvice, SequenceRequest, SubmitError};
use crate::model::{LlamaModel, ModelError};

/// Why a cache could not be made now.
pub(super) enum NoCache {
    /// Not while other sequences (or the prompt cache) hold the budget:
    /// `short` bytes are missing; try again when some are freed.
    Later { short: usize },
    /// Never (bigger than the whole budget) or another failure: the message.
    Failed(String),
}

/// Positions of `request`'s cache on `model`.
pub(super) fn positions<B: Backend>(model: &LlamaModel<B>, request: &SequenceRequest) -> usize {
    kv_positions(
        request.prompt.len(),
        request.stop.max_tokens,
        model.config().context_length,
    )
}

/// `request`'s cache, starting from what the prompt cache found
/// (`prefix`), if the budget has room for it now.
pub(super) fn make_cache<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    request: &SequenceRequest,
    prefix: KvPrefix<'_, B::KvBlock>,
) -> Result<B::KvCache, NoCache> {
    let positions = positions(model, request);
    match model.new_cache_with_prefix(backend, positions, prefix) {
        Ok(cache) => Ok(cache),
        Err(ModelError::Kernel(KernelError::KvBudget {
            needed,
            budget,
            free,
        })) if needed <= budget => Err(NoCache::Later {
            short: needed.saturating_sub(free),
        }),
        Err(e) => Err(NoCache::Failed(format!(
            "cannot allocate a KV cache of {positions} tokens: {e}"
        ))),
    }
}

/// The refusal for a request whose cache would not fit even an empty
/// budget; `None` when it fits (now or once others finish). Makes and
/// drops a cache to ask: reserving is a counter, blocks are allocated only
/// when written.
pub(super) fn never_fits<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    request: &SequenceRequest,
) -> Option<SubmitError> {
    let too_big = |positions: usize| match model.new_cache(backend, positions) {
        Err(ModelError::Kernel(KernelError::KvBudget { needed, budget, .. }))
            if needed > budget =>
        {
            Some((needed, budget))
        }
        _ => None,
    };
    let positions = positions(model, request);
    let (needed_bytes, budget_bytes) = too_big(positions)?;
    let prompt_too_long = too_big(request.prompt.len() + 1).is_some();
    let advice = match (prompt_too_long, request.stop.max_tokens) {
        (true, _) => KvAdvice::ShortenPrompt,
        (false, None) => KvAdvice::SetMaxTokens,
        (false, Some(_)) => KvAdvice::LowerMaxTokens,
    };
    Some(SubmitError::KvBudget {
        positions,
        needed_bytes,
        budget_bytes,
        advice,
        prompt_too_long,
    })
}

/// One request's generations together may reserve at most 1/`REQUEST_SHARE`
/// of the KV budget: a 300-byte request (`n: 16`, four prompts, a long
/// `max_tokens`) held 95% of it and every other client waited for as long
/// as it stayed connected. A single generation is bounded by the budget alone.
pub const REQUEST_SHARE: usize = 2;

/// Positions of the probe that learns the budget: more than any budget
/// holds, so it never reserves anything (reserving is a counter).
const PROBE_POSITIONS: usize = 1 << 40;

/// The refusal for a request of `fanout` generations like `request` whose
/// caches together exceed [`REQUEST_SHARE`]; `None` when they fit (or the
/// budget is unlimited). The bytes per position come from a probe that
/// fails without reserving (sliding-window layers make it a lower bound).
pub(super) fn over_share<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    request: &SequenceRequest,
    fanout: usize,
) -> Option<SubmitError> {
    if fanout <= 1 {
        return None;
    }
    let Err(ModelError::Kernel(KernelError::KvBudget { needed, budget, .. })) =
        model.new_cache(backend, PROBE_POSITIONS)
    else {
        return None;
    };
    let per_position = needed / PROBE_POSITIONS;
    let needed_bytes = per_position
        .saturating_mul(positions(model, request))
        .saturating_mul(fanout);
    let share_bytes = budget / REQUEST_SHARE;
    (needed_bytes > share_bytes).then_some(SubmitError::KvShare {
        fanout,
        needed_bytes,
        share_bytes,
        share: REQUEST_SHARE,
    })
}
