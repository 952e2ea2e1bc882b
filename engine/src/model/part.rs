//! What one checkpoint brings to a shared step.

use switchyard_kernels::Backend;

use super::llama::{LlamaModel, SequenceChunk};
use crate::adapter::ResidentAdapter;

/// One checkpoint's share of a step: its weights and its sequences' chunks.
pub struct ModelPart<'s, 'a, B: Backend> {
    pub model: &'s LlamaModel<B>,
    pub chunks: &'s mut [SequenceChunk<'a>],
    /// The LoRA adapter over the part's weights, if any: its low-rank
    /// updates are added to this part's rows only. Parts that differ only
    /// in their adapter share every base product of the step.
    pub adapter: Option<&'s ResidentAdapter<B>>,
}
