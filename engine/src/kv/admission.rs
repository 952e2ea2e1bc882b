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

use super::{KvBlocks, KvError, KvPool, SequenceKv, SharedBlock};
use crate::model::LlamaModel;

/// What a request refused for its KV cache should change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvAdvice {
    /// Set `max_tokens` (the request had none, so it asked for the whole context).
    SetMaxTokens,
    /// Lower `max_tokens`.
    LowerMaxTokens,
    /// Even one generated token does not fit after the prompt.
    ShortenPrompt,
}

impl std::fmt::Display for KvAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvAdvice::SetMaxTokens => {
                "without max_tokens the cache spans the whole context window; set max_tokens"
            }
            KvAdvice::LowerMaxTokens => "lower max_tokens",
            KvAdvice::ShortenPrompt => "shorten the prompt",
        })
    }
}

/// Positions a request's KV cache is made for: its prompt and `max_tokens`
/// (without it, up to the context window), at most the context window.
pub fn kv_positions(prompt_tokens: usize, max_tokens: Option<usize>, context: usize) -> usize {
    prompt_tokens
        .saturating_add(max_tokens.unwrap_or(context))
        .min(context)
}

/// A request whose cache would not fit even an empty budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KvRefusal {
    /// Positions the cache would hold (prompt + max_tokens, at most the context).
    pub(crate) positions: usize,
    pub(crate) needed_bytes: usize,
    pub(crate) budget_bytes: usize,
    pub(crate) advice: KvAdvice,
    /// Whether the prompt alone (with one token to generate) does not fit either.
    pub(crate) prompt_too_long: bool,
}

/// What admission reads of a request: its prompt's length and `max_tokens`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wanted {
    pub(crate) prompt: usize,
    pub(crate) max_tokens: Option<usize>,
}

/// Why a cache could not be made now.
pub(crate) enum NoCache {
    /// Not while other sequences (or the prompt cache) hold the budget:
    /// `short` bytes are missing; try again when some are freed.
    Later { short: usize },
    /// Never (bigger than the whole budget) or another failure: the message.
    Failed(String),
}

/// Positions of `request`'s cache on `model`.
pub(crate) fn positions<B: Backend>(model: &LlamaModel<B>, request: Wanted) -> usize {
    kv_positions(
        request.prompt,
        request.max_tokens,
        model.config().context_length,
    )
}

/// `request`'s cache, starting from what the prompt cache found
/// (`prefix`), if the budget has room for it now.
pub(crate) fn make_cache<B: Backend>(
    backend: &B,
    blocks: &Arc<KvBlocks<B>>,
    model: &LlamaModel<B>,
    request: Wanted,
    prefix: KvPrefix<'_, SharedBlock<B>>,
) -> Result<SequenceKv<B>, NoCache> {
    let positions = positions(model, request);
    let made = SequenceKv::for_model(backend, blocks, model, positions, prefix);
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
    request: Wanted,
) -> Option<KvRefusal> {
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
    let prompt_too_long = too_big(request.prompt + 1).is_some();
    let advice = match (prompt_too_long, request.max_tokens) {
        (true, _) => KvAdvice::ShortenPrompt,
        (false, None) => KvAdvice::SetMaxTokens,
        (false, Some(_)) => KvAdvice::LowerMaxTokens,
    };
    Some(KvRefusal {
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

/// A request of several generations whose caches together exceed
/// [`REQUEST_SHARE`] of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverShare {
    pub(crate) needed_bytes: usize,
    pub(crate) share_bytes: usize,
}

/// The refusal for `fanout` generations like `request` whose caches
/// together exceed [`REQUEST_SHARE`] of the budget; `None` when they fit.
/// Reads the cache's layout: nothing is reserved or allocated to ask.
pub(crate) fn over_share<B: Backend>(
    pool: &KvPool,
    model: &LlamaModel<B>,
    request: Wanted,
    fanout: usize,
) -> Option<OverShare> {
    if fanout <= 1 {
        return None;
    }
    let per_generation = cache_bytes(pool, model, request)?;
    let needed_bytes = per_generation.saturating_mul(fanout);
    let share_bytes = pool.budget_bytes() / REQUEST_SHARE;
    (needed_bytes > share_bytes).then_some(OverShare {
        needed_bytes,
        share_bytes,
    })
}

/// Bytes `request`'s cache reserves when nothing of it is cached: what one
/// generation may hold of the budget (`None` when the model has no layout
/// for it, which making the cache reports).
pub(crate) fn cache_bytes<B: Backend>(
    pool: &KvPool,
    model: &LlamaModel<B>,
    request: Wanted,
) -> Option<usize> {
    Some(
        model
            .kv_layout(pool.format(), positions(model, request))
            .ok()?
            .bytes_beyond(0),
    )
}
