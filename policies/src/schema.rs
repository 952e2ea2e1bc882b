//! The policy file as written: serde types mirroring the TOML, with spans for error reporting.
//!
//! These types are only the parse step; `validate` turns them into a [`crate::Policy`].
//! Every field that validation may complain about is `Spanned`, so its error can point at
//! the exact line and column.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyFile {
    #[serde(default)]
    pub routing: Option<Spanned<RoutingEntry>>,
    #[serde(default)]
    pub models: Vec<Spanned<ModelEntry>>,
    #[serde(default)]
    pub tenants: Vec<Spanned<TenantEntry>>,
    #[serde(default)]
    pub splits: Vec<Spanned<SplitEntry>>,
    #[serde(default)]
    pub fallbacks: Vec<Spanned<FallbackEntry>>,
    #[serde(default)]
    pub cascade: Option<Spanned<CascadeEntry>>,
}

/// `[cascade]`: under `auto`, the first model answers and defers to the next when its
/// confidence in the answer is below `min_confidence`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CascadeEntry {
    pub models: Spanned<Vec<Spanned<String>>>,
    /// `mean`, `min`, `p05`, `p10` (default), `p25` or `p50`.
    pub confidence: Option<Spanned<String>>,
    pub min_confidence: Spanned<f64>,
    /// Under `min_margin`: the next model continues the answer from its first unsure
    /// token instead of answering from scratch (default false).
    pub handoff: Option<Spanned<bool>>,
}

/// `[routing]`: weights of the utility function and request defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RoutingEntry {
    pub quality_weight: Option<Spanned<f64>>,
    pub cost_weight: Option<Spanned<f64>>,
    pub latency_weight: Option<Spanned<f64>>,
    pub assumed_output_tokens: Option<Spanned<u32>>,
    #[serde(default)]
    pub allow_anonymous: bool,
}

/// `[[models]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelEntry {
    pub name: Spanned<String>,
    pub version: Option<Spanned<String>>,
    pub versions: Option<Spanned<Vec<Spanned<String>>>>,
    pub active_version: Option<Spanned<String>>,
    #[serde(default)]
    pub aliases: Vec<Spanned<String>>,
    pub cost_per_1k_input: Spanned<f64>,
    pub cost_per_1k_output: Spanned<f64>,
    /// Required unless `quality_from` names a suite; then the figure used while no fresh
    /// measurement exists.
    pub quality: Option<Spanned<f64>>,
    #[serde(default)]
    pub quality_by_tag: BTreeMap<String, Spanned<f64>>,
    /// A suite whose measured accuracy (on the active version) is the model's quality.
    pub quality_from: Option<Spanned<String>>,
    /// Per tag, the suite whose measured accuracy is the model's quality for that tag.
    #[serde(default)]
    pub quality_from_by_tag: BTreeMap<String, Spanned<String>>,
    pub context_limit: Spanned<u32>,
    pub latency_target_ms: Option<Spanned<f64>>,
    pub max_queue_depth: Option<Spanned<u32>>,
}

/// `[[tenants]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantEntry {
    pub name: Spanned<String>,
    #[serde(default)]
    pub api_keys: Vec<Spanned<String>>,
    pub allowed_models: Option<Vec<Spanned<String>>>,
    pub default_hints: Option<Spanned<HintsEntry>>,
    #[serde(default)]
    pub budgets: Vec<Spanned<BudgetEntry>>,
    /// A prompt-cache scope shared with the tenants naming the same one.
    pub cache_scope: Option<Spanned<String>>,
    /// Limits of all the tenant's requests together.
    pub rate_limits: Option<Spanned<RateLimitEntry>>,
    /// Limits of each of the tenant's keys.
    pub key_rate_limits: Option<Spanned<RateLimitEntry>>,
    /// Share of the engine's batch slots when requests queue (default 1).
    pub weight: Option<Spanned<i64>>,
    /// Most of the engine's KV budget (and queue) its requests may hold, 0 < x <= 1.
    pub kv_share: Option<Spanned<f64>>,
}

/// `rate_limits = { requests_per_minute = 60, tokens_per_minute = 40000 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitEntry {
    pub requests_per_minute: Option<Spanned<i64>>,
    pub tokens_per_minute: Option<Spanned<i64>>,
}

/// Default hints of a tenant, same meaning as the request headers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HintsEntry {
    pub min_quality: Option<Spanned<f64>>,
    pub max_cost: Option<Spanned<f64>>,
    pub max_latency_ms: Option<Spanned<f64>>,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `[[tenants.budgets]]`: exactly one of `limit_tokens` / `limit_cost`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetEntry {
    pub window: Spanned<String>,
    pub limit_tokens: Option<Spanned<i64>>,
    pub limit_cost: Option<Spanned<f64>>,
}

/// `[[splits]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SplitEntry {
    pub name: Spanned<String>,
    pub model: Spanned<String>,
    #[serde(default)]
    pub sticky: StickyEntry,
    pub arms: Spanned<Vec<Spanned<ArmEntry>>>,
    pub rollback: Option<Spanned<RollbackEntry>>,
}

/// What keeps a caller on one arm.
#[derive(Debug, Default, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StickyEntry {
    #[default]
    User,
    Key,
    None,
}

/// One arm of a split.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArmEntry {
    pub name: Spanned<String>,
    pub target: Spanned<String>,
    pub weight: Spanned<f64>,
}

/// `[splits.rollback]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RollbackEntry {
    pub baseline: Spanned<String>,
    pub candidate: Spanned<String>,
    pub window: Spanned<String>,
    pub min_samples: Spanned<u32>,
    pub max_error_rate_increase: Option<Spanned<f64>>,
    pub max_latency_ratio: Option<Spanned<f64>>,
    pub max_confidence_drop: Option<Spanned<f64>>,
    pub max_feedback_drop: Option<Spanned<f64>>,
    pub eval_suite: Option<Spanned<String>>,
    pub max_eval_drop: Option<Spanned<f64>>,
}

/// `[[fallbacks]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FallbackEntry {
    pub model: Spanned<String>,
    pub on: Option<Vec<TriggerEntry>>,
    pub alternatives: Spanned<Vec<Spanned<String>>>,
}

/// When a fallback applies.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TriggerEntry {
    Overloaded,
    Failing,
    OverBudget,
}
