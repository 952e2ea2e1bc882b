//! The rows of a step that take an adapter, and the call that adds their
//! updates: the base's products run once over every row, then each
//! adapter's low-rank update goes to its own rows (grouped by adapter, the
//! SGMV idea), one backend call per weight for all adapters of the step.

use std::ops::Range;

use switchyard_kernels::{Backend, LoraRows, LoraUpdate};

use super::part::ModelPart;
use super::ModelError;
use crate::adapter::{ResidentAdapter, Target};

/// Runs of consecutive rows whose parts share one adapter.
pub(super) struct AdapterRuns<'a, B: Backend> {
    runs: Vec<(Range<usize>, &'a ResidentAdapter<B>)>,
}

impl<'a, B: Backend> AdapterRuns<'a, B> {
    /// The adapters of `parts`, whose rows are `part_rows`.
    pub(super) fn of(parts: &[ModelPart<'a, '_, B>], part_rows: &[Range<usize>]) -> Self {
        let mut runs: Vec<(Range<usize>, &'a ResidentAdapter<B>)> = Vec::new();
        for (part, rows) in parts.iter().zip(part_rows) {
            let Some(adapter) = part.adapter else {
                continue;
            };
            match runs.last_mut() {
                Some((last, a)) if last.end == rows.start && std::ptr::eq(*a, adapter) => {
                    last.end = rows.end;
                }
                _ => runs.push((rows.clone(), adapter)),
            }
        }
        AdapterRuns { runs }
    }

    /// `out[rows] += update(x[rows])` for every run whose adapter changes
    /// `target` of layer `layer`.
    pub(super) fn apply(
        &self,
        backend: &B,
        layer: usize,
        target: Target,
        x: &B::Activations,
        out: &mut B::Activations,
    ) -> Result<(), ModelError> {
        if self.runs.is_empty() {
            return Ok(());
        }
        let rows = self.rows(layer, target);
        if rows.is_empty() {
            return Ok(());
        }
        Ok(backend.lora(x, &rows, out)?)
    }

    /// [`AdapterRuns::apply`] for several targets that read the same
    /// input `x` (Q, K and V; gate and up), in one backend call.
    pub(super) fn apply_many(
        &self,
        backend: &B,
        layer: usize,
        x: &B::Activations,
        outs: &mut [(Target, &mut B::Activations)],
    ) -> Result<(), ModelError> {
        if self.runs.is_empty() {
            return Ok(());
        }
        let rows: Vec<Vec<LoraRows<'_, B>>> = outs
            .iter()
            .map(|(target, _)| self.rows(layer, *target))
            .collect();
        let mut updates: Vec<LoraUpdate<'_, '_, B>> = outs
            .iter_mut()
            .zip(&rows)
            .filter(|(_, runs)| !runs.is_empty())
            .map(|((_, out), runs)| LoraUpdate {
                runs,
                out: &mut **out,
            })
            .collect();
        if updates.is_empty() {
            return Ok(());
        }
        Ok(backend.lora_many(x, &mut updates)?)
    }

    /// The runs whose adapter changes `target` of layer `layer`.
    fn rows(&self, layer: usize, target: Target) -> Vec<LoraRows<'_, B>> {
        self.runs
            .iter()
            .filter_map(|(rows, adapter)| {
                let w = adapter.weight(layer, target)?;
                Some(LoraRows {
                    rows: rows.clone(),
                    a: &w.a,
                    b_t: &w.b_t,
                    scale: w.scale,
                })
            })
            .collect()
    }
}
