//! The KV caches of evaluated sequences, and the prefill steps that fill
//! them: contexts fed a chunk at a time, batched over sequences.

use switchyard_kernels::{Backend, KvPrefix};

use super::error::EvalError;
use crate::kv::{KvConfig, KvPool, SequenceKv};
use crate::model::{LlamaModel, LogitRows, SequenceChunk};
use crate::session::PREFILL_CHUNK;

/// A KV cache of `capacity` positions for one evaluated sequence, outside
/// any serving budget (an evaluation runs on its own, like a `Session`).
pub(crate) fn eval_cache<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    capacity: usize,
) -> Result<SequenceKv<B>, EvalError> {
    let pool = KvPool::new(KvConfig {
        budget_bytes: usize::MAX,
        ..KvConfig::default()
    });
    Ok(SequenceKv::for_model(
        backend,
        &pool,
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
    contexts: impl Iterator<Item = &'a [u32]>,
    caches: &'a mut [SequenceKv<B>],
    fed: &mut [usize],
) -> (Vec<SequenceChunk<'a, B>>, Vec<usize>) {
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
            adapter: None,
            tokens: &context[fed[i]..fed[i] + take],
            start_pos: fed[i],
            cache: cache.device(),
            logits: if last {
                LogitRows::Last
            } else {
                LogitRows::None
            },
        });
        if last {
            ending.push(i);
        }
        fed[i] += take;
    }
    (chunks, ending)
}
