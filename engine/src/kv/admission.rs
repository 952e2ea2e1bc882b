//! Admission by KV blocks.
//!
//! A sequence's cache reserves from the KV budget every block it may hold
//! (prompt + `max_tokens`, or the whole context without `max_tokens`)
//! when it is made, and gives them back when the sequence ends. So the
//! budget decides admission up front: a request whose cache could never
//! fit is refused at submit with a 4xx naming what to change; one that
//! fits the budget but not what is free now waits in the queue until
//! running sequences end; a running sequence never runs out.

use std::sync::Arc;

use switchyard_kernels::{Backend, KvPrefix};

use super::{KvError, KvPool, SequenceKv, SharedBlock};
use crate::model::LlamaModel;
use crate::serving::{kv_positions, KvAdvice, SequenceRequest, SubmitError};

/// Why a cache could not be made now.
pub(crate) enum NoCache {
    /// Not while other sequences (or the prompt cache) hold the budget:
    /// `short` bytes are missing; try again when some are freed.
    Later { short: usize },
    /// Never (bigger than the whole budget) or another failure: the message.
    Failed(String),
}

/// Positions of `request`'s cache on `model`.
pub(crate) fn positions<B: Backend>(model: &LlamaModel<B>, request: &SequenceRequest) -> usize {
    kv_positions(
        request.prompt.len(),
        request.stop.max_tokens,
        model.config().context_length,
    )
}

/// `request`'s cache, starting from what the prompt cache found
/// (`prefix`), if the budget has room for it now.
pub(crate) fn make_cache<B: Backend>(
    backend: &B,
    pool: &Arc<KvPool>,
    model: &LlamaModel<B>,
    request: &SequenceRequest,
    prefix: KvPrefix<'_, SharedBlock<B>>,
) -> Result<SequenceKv<B>, NoCache> {
    let positions = positions(model, request);
    let made = model
        .kv_layout(pool.format(), positions)
        .map_err(KvError::from)
        .and_then(|layout| SequenceKv::new(backend, pool, layout, prefix));
    match made {
        Ok(cache) => Ok(cache),
        Err(KvError::Budget {
            needed,
            budget,
            free,
        }) if needed <= budget => Err(NoCache::Later {
            short: needed.saturating_sub(free),
        }),
        Err(e) => Err(NoCache::Failed(format!(
            "cannot allocate a KV cache of {positions} tokens: {e}"
        ))),
    }
}

/// The refusal for a request whose cache would not fit even an empty
/// budget; `None` when it fits (now or once others finish). Reads the
/// cache's layout: nothing is reserved or allocated to ask.
pub(crate) fn never_fits<B: Backend>(
    pool: &KvPool,
    model: &LlamaModel<B>,
    request: &SequenceRequest,
) -> Option<SubmitError> {
    let budget = pool.budget_bytes();
    let too_big = |positions: usize| {
        let needed = model
            .kv_layout(pool.format(), positions)
            .ok()?
            .bytes_beyond(0);
        (needed > budget).then_some((needed, budget))
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
