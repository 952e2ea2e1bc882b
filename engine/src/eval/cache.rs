//! The KV caches of evaluated sequences, and the prefill steps that fill
//! them: contexts fed a chunk at a time, batched over sequences.

use std::sync::Arc;

use switchyard_kernels::{Backend, KvPrefix};

use super::error::EvalError;
use crate::kv::{KvBlocks, KvConfig, KvPool, SequenceKv};
use crate::model::{LlamaModel, LogitRows, SequenceChunk};
use crate::session::PREFILL_CHUNK;

/// The store of an evaluation's caches, outside any serving budget (an
/// evaluation runs on its own, like a `Session`).
pub(crate) fn eval_blocks<B: Backend>(backend: &B) -> Result<Arc<KvBlocks<B>>, EvalError> {
    let pool = KvPool::new(KvConfig {
        budget_bytes: usize::MAX,
        ..KvConfig::default()
    });
    Ok(KvBlocks::new(backend, &pool)?)
}

/// A KV cache of `capacity` positions in `blocks` for one evaluated sequence.
pub(crate) fn eval_cache<B: Backend>(
    backend: &B,
    blocks: &Arc<KvBlocks<B>>,
    model: &LlamaModel<B>,
    capacity: usize,
) -> Result<SequenceKv<B>, EvalError> {
    Ok(SequenceKv::for_model(
        backend,
        blocks,
        model,
        capacity,
        KvPrefix::none(),
    )?)
}

/// The next prefill step of `contexts` (one per cache): a chunk of at most
/// [`PREFILL_CHUNK`] tokens of each context not yet fed (`fed` counts what
/// was), the last chunk of a context asking for its last logits row; and the
/// indices of the contexts that end in this step, in chunk order (one logits
/// row each). No chunk once every context is fed.
pub(crate) fn prefill_step<'a, B: Backend>(
    backend: &B,
    contexts: impl Iterator<Item = &'a [u32]>,
    caches: &'a mut [SequenceKv<B>],
    fed: &mut [usize],
) -> Result<(Vec<SequenceChunk<'a>>, Vec<usize>), EvalError> {
    let mut chunks = Vec::new();
    let mut ending = Vec::new();
    for (i, (context, cache)) in contexts.zip(caches.iter_mut()).enumerate() {
        let remaining = context.len() - fed[i];
        if remaining == 0 {
            continue;
        }
        let take = remaining.min(PREFILL_CHUNK);
        let last = take == remaining;
        chunks.push(SequenceChunk {
            tokens: &context[fed[i]..fed[i] + take],
            start_pos: fed[i],
            table: cache.prepare(backend, fed[i]..fed[i] + take)?,
            logits: if last {
                LogitRows::Last
            } else {
                LogitRows::None
            },
            prompt: true,
        });
        if last {
            ending.push(i);
        }
        fed[i] += take;
    }
    Ok((chunks, ending))
}
