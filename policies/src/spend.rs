//! What a request spends, and what budgets count: the amounts that the compiled policy
//! prices, budgets hold and metrics record.

use std::sync::Arc;

use serde::Serialize;

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetUnit {
    /// Prompt plus completion tokens.
    Tokens,
    /// Currency, priced with the model's per-1k-token costs.
    Cost,
}

impl BudgetUnit {
    /// How a budget of this unit over `window_secs` is named in errors and explanations,
    /// e.g. `tokens per 3600s`.
    pub(crate) fn label(self, window_secs: u64) -> Arc<str> {
        let unit = match self {
            BudgetUnit::Tokens => "tokens",
            BudgetUnit::Cost => "cost",
        };
        format!("{unit} per {window_secs}s").into()
    }
}

pub use switchyard_seam::Usage;

/// What a request spent (or is estimated to spend).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spend {
    /// Prompt plus completion tokens.
    pub tokens: u64,
    /// Cost in the policy's currency.
    pub cost: f64,
}

impl Spend {
    /// The amount of this spend that a budget counting `unit` counts.
    #[inline]
    pub(crate) fn in_unit(&self, unit: BudgetUnit) -> f64 {
        match unit {
            BudgetUnit::Tokens => self.tokens as f64,
            BudgetUnit::Cost => self.cost,
        }
    }
}

/// Per-1k-token prices of one model, kept by a reservation to price the actual usage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Price {
    pub per_1k_input: f64,
    pub per_1k_output: f64,
}

impl Price {
    pub(crate) fn spend(&self, prompt_tokens: u64, output_tokens: u64) -> Spend {
        Spend {
            tokens: prompt_tokens + output_tokens,
            cost: prompt_tokens as f64 / 1000.0 * self.per_1k_input
                + output_tokens as f64 / 1000.0 * self.per_1k_output,
        }
    }
}
