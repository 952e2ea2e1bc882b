//! The numbers of every model that the `auto` scan checks, as columns (see
//! [`crate::scan`] for the pass over them).

use crate::compiled::model::Model;

/// Per model, in model order: the numbers the policy-and-request constraints read.
#[derive(Debug, Default)]
pub(crate) struct ScanTable {
    pub cost_per_1k_input: Box<[f64]>,
    pub cost_per_1k_output: Box<[f64]>,
    pub quality: Box<[f64]>,
    pub context_limit: Box<[u64]>,
}

impl ScanTable {
    pub(crate) fn new(models: &[Model]) -> Self {
        ScanTable {
            cost_per_1k_input: models.iter().map(|m| m.cost_per_1k_input).collect(),
            cost_per_1k_output: models.iter().map(|m| m.cost_per_1k_output).collect(),
            quality: models.iter().map(|m| m.quality).collect(),
            context_limit: models.iter().map(|m| u64::from(m.context_limit)).collect(),
        }
    }
}
