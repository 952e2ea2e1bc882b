//! The KV cache of one evaluated sequence.

use switchyard_kernels::{Backend, KvPrefix};

use super::error::EvalError;
use crate::kv::{KvConfig, KvPool, SequenceKv};
use crate::model::LlamaModel;

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
