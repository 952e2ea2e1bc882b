//! The weight table: the checkpoints whose weights the next forward step
//! reads. Usually one; checkpoints that share most of their tensors (a base
//! and its fine-tunes, say) run in one step, so the table lists them all,
//! in the order their rows are laid out.

use std::sync::Arc;

use switchyard_kernels::Backend;

use super::checkpoint::{CheckpointHandle, CheckpointId, ServedCheckpoint};

pub(super) struct WeightTable<B: Backend> {
    /// Never empty: the executor builds a table from a chosen checkpoint.
    pub(super) checkpoints: Vec<CheckpointHandle<B>>,
}

impl<B: Backend> WeightTable<B> {
    /// The checkpoint the scheduler chose (the others joined its step).
    pub(super) fn lead(&self) -> Option<&ServedCheckpoint<B>> {
        self.checkpoints.first().map(|c| &**c)
    }

    pub(super) fn lead_id(&self) -> Option<CheckpointId> {
        self.lead().map(|c| c.id.clone())
    }

    /// Whether the step reads `checkpoint`'s weights.
    pub(super) fn holds(&self, checkpoint: &CheckpointHandle<B>) -> bool {
        self.checkpoints.iter().any(|c| Arc::ptr_eq(c, checkpoint))
    }

    /// Whether this table lists exactly `checkpoints`, in that order.
    pub(super) fn is(&self, checkpoints: &[CheckpointHandle<B>]) -> bool {
        self.checkpoints.len() == checkpoints.len()
            && self
                .checkpoints
                .iter()
                .zip(checkpoints)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}
