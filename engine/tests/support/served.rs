//! A checkpoint file served straight to the executor, without a registry:
//! what the executor-level tests (`serving_batch`, `kv_budget`,
//! `prompt_cache`) run on. Include it with
//! `#[path = "support/served.rs"] mod served;`.

use std::path::Path;
use std::sync::Arc;

use switchyard_engine::chat::ChatTemplate;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::serving::{CheckpointHandle, CheckpointId, ServedCheckpoint};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::Backend;

/// The checkpoint at `path` loaded on `backend` as `test@1`, with the
/// default chat template.
pub fn serve<B: Backend>(backend: &B, path: &Path) -> CheckpointHandle<B> {
    let checkpoint = load_checkpoint(path).unwrap();
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    Arc::new(ServedCheckpoint::from_parts(
        CheckpointId::new("test", "1"),
        model,
        tokenizer,
        ChatTemplate::new_or_default(None).unwrap(),
        path,
        checkpoint.format,
    ))
}
