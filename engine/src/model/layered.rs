//! A step run one layer at a time, so that its caller may run another,
//! short step between two of its layers (`serving::interleave`).
//!
//! What a row computes does not depend on what runs between its layers:
//! every kernel reads only its own rows (in the step's scratch, which the
//! other step does not touch) and its sequence's cache. So a step paused
//! after layer `k` and resumed gives the very logits it gives unpaused.
//! Unkeyed: a backend that records and replays steps records none of it,
//! and only a backend that launches each call as it comes may run another
//! step before it ends.

use switchyard_kernels::Backend;

use super::llama::Scratch;
use super::part::ModelPart;
use super::step::{checked, close, layer, open, output, Flat, StepOutput};
use super::ModelError;

/// A step begun over some parts' chunks, the layers it has run so far.
pub struct LayeredStep {
    flat: Flat,
    next: usize,
    layers: usize,
}

impl LayeredStep {
    /// Opens a step over `parts` (the same parts and scratch for every
    /// later call): their embeddings, no layer yet.
    pub fn begin<B: Backend>(
        backend: &B,
        parts: &[ModelPart<'_, '_, B>],
        scratch: &mut Scratch<B>,
    ) -> Result<Self, ModelError> {
        let flat = checked(parts)?;
        let layers = parts.first().map_or(0, |p| p.model.config().n_layers);
        if let Err(e) = open(backend, parts, scratch, &flat, None) {
            backend.abort_step();
            return Err(e);
        }
        Ok(LayeredStep {
            flat,
            next: 0,
            layers,
        })
    }

    /// Whether a layer is left to run.
    pub fn has_layer(&self) -> bool {
        self.next < self.layers
    }

    /// Runs the next layer (its caches' blocks in `kv`).
    pub fn layer<B: Backend>(
        &mut self,
        backend: &B,
        kv: &mut B::KvStore,
        parts: &mut [ModelPart<'_, '_, B>],
        scratch: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        if let Err(e) = layer(backend, kv, parts, scratch, &self.flat, self.next) {
            backend.abort_step();
            return Err(e);
        }
        self.next += 1;
        Ok(())
    }

    /// After the last layer: the step's output, as `forward_step` returns it.
    pub fn finish<'s, B: Backend>(
        self,
        backend: &B,
        parts: &[ModelPart<'_, '_, B>],
        scratch: &'s mut Scratch<B>,
    ) -> Result<StepOutput<'s>, ModelError> {
        if self.has_layer() {
            backend.abort_step();
            return Err(ModelError::MissingLayer { index: self.next });
        }
        match close(backend, parts, scratch, &self.flat) {
            Ok(wanted) => Ok(output(backend, scratch, wanted)),
            Err(e) => {
                backend.abort_step();
                Err(e)
            }
        }
    }
}
