//! A validated policy: models, tenants, splits and fallbacks, indexed for routing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::budget::BudgetWindow;
use crate::engine::{CheckpointKey, ProbeCell};
use crate::error::PolicyError;
use crate::keys::{self, KeyDigest};
use crate::metrics::{RouteCounters, TenantMeter};
use crate::request::Hints;
use crate::rollback::RollbackStatus;
use crate::scan::ScanTable;
use crate::split::Split;
use crate::tags::TagTable;

/// Weights of the utility function and request defaults (`[routing]`).
///
/// `utility = quality_weight × quality − cost_weight × estimated_cost
///            − latency_weight × expected_latency_ms`
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Routing {
    /// Utility per quality point (quality is 0..=1).
    pub quality_weight: f64,
    /// Utility lost per unit of currency the request is estimated to cost.
    pub cost_weight: f64,
    /// Utility lost per millisecond of expected latency.
    pub latency_weight: f64,
    /// Output tokens assumed when a request sets no `max_tokens`.
    pub assumed_output_tokens: u32,
    /// Whether requests without an API key are routed (with no tenant).
    pub allow_anonymous: bool,
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            quality_weight: 1.0,
            cost_weight: 100.0,
            latency_weight: 0.0002,
            assumed_output_tokens: 256,
            allow_anonymous: false,
        }
    }
}

/// One model with its versions and economics.
#[derive(Debug)]
pub struct Model {
    /// Unique name.
    pub name: Arc<str>,
    /// Known versions, in file order.
    pub versions: Vec<Arc<str>>,
    /// Index into `versions` served when no split or pin applies.
    pub active_version: usize,
    /// Other names for this model.
    pub aliases: Vec<Arc<str>>,
    /// Cost per 1,000 prompt tokens.
    pub cost_per_1k_input: f64,
    /// Cost per 1,000 generated tokens.
    pub cost_per_1k_output: f64,
    /// Overall quality, 0..=1.
    pub quality: f64,
    /// Quality per task tag, 0..=1, sorted by tag; tags not listed use `quality`.
    /// A short vector: a linear scan beats hashing for the handful of tags a model has.
    pub quality_by_tag: Vec<(String, f64)>,
    /// Most tokens (prompt + output) the model accepts.
    pub context_limit: u32,
    /// Expected latency above which the model counts as overloaded.
    pub latency_target_ms: Option<f64>,
    /// Queue depth at or above which the model counts as overloaded.
    pub max_queue_depth: Option<u32>,
    /// Index of the split deciding this model's version, if any.
    pub split: Option<usize>,
    /// What to try when this model is overloaded, failing or over budget.
    pub fallback: Option<Fallback>,
}

impl Model {
    /// Quality for a set of tags: the lowest per-tag score (overall for unlisted tags),
    /// or the overall score with no tags. Returns the tag that set it.
    pub fn quality_for<'t>(&self, tags: &'t [String]) -> (f64, Option<&'t str>) {
        let mut best: Option<(f64, &str)> = None;
        for tag in tags {
            let q = self
                .quality_by_tag
                .iter()
                .find(|(t, _)| t == tag)
                .map_or(self.quality, |&(_, q)| q);
            if best.is_none_or(|(b, _)| q < b) {
                best = Some((q, tag.as_str()));
            }
        }
        match best {
            Some((q, tag)) => (q, Some(tag)),
            None => (self.quality, None),
        }
    }
}

/// One checkpoint of the policy, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// Index into [`Policy::models`].
    pub model: usize,
    /// Index into that model's versions; `None` means "as if named": split or active.
    pub version: Option<usize>,
}

/// Conditions under which a fallback list is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Triggers {
    /// Latency target or queue limit broken.
    pub overloaded: bool,
    /// The engine reports the checkpoint unhealthy.
    pub failing: bool,
    /// A tenant budget cannot cover the request.
    pub over_budget: bool,
}

/// Ordered alternatives for one model.
#[derive(Debug, Clone)]
pub struct Fallback {
    /// When to use them.
    pub on: Triggers,
    /// Tried in order; the first that meets every constraint wins.
    pub alternatives: Vec<Target>,
}

/// A tenant: who may use what, and how much.
#[derive(Debug)]
pub struct Tenant {
    /// Unique name.
    pub name: Arc<str>,
    /// Per model index, whether the tenant may use it; `None` allows all.
    pub allowed: Option<Vec<bool>>,
    /// Hints applied when a request does not set them.
    pub default_hints: Hints,
    /// Spend budgets, all of which must cover a request.
    pub budgets: Vec<Arc<BudgetWindow>>,
    /// The tenant's spend counters.
    pub meter: Arc<TenantMeter>,
}

impl Tenant {
    /// Whether the tenant may use model `model` (an index into [`Policy::models`]).
    pub fn may_use(&self, model: usize) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|a| a.get(model).copied().unwrap_or(false))
    }
}

/// A validated policy. Build one with [`Policy::from_toml_str`] or [`Policy::load`];
/// route with [`crate::route`]. Immutable except for budget and rollback counters.
#[derive(Debug)]
pub struct Policy {
    pub(crate) source_name: String,
    pub(crate) routing: Routing,
    pub(crate) models: Vec<Model>,
    /// Names and aliases to model indices.
    pub(crate) model_names: HashMap<Box<str>, usize>,
    pub(crate) tenants: Vec<Tenant>,
    pub(crate) tenant_names: HashMap<Box<str>, usize>,
    pub(crate) keys: HashMap<KeyDigest, usize>,
    pub(crate) splits: Vec<Split>,
    /// Per model, the index of its first version among all checkpoints (for bitsets).
    pub(crate) checkpoint_base: Vec<usize>,
    /// Number of checkpoints (model versions) in the policy.
    pub(crate) checkpoint_count: usize,
    /// Per-tag quality of every model, by tag id, for scoring.
    pub(crate) tags: TagTable,
    /// The numbers the `auto` scan checks for every model, as columns.
    pub(crate) scan: ScanTable,
    /// Whether some split arm targets another model than its split's: then two models
    /// can stand for the same checkpoint, and `auto` must drop the repeat.
    pub(crate) cross_model_arms: bool,
    /// Handles of the routed-request counters.
    pub(crate) route_counters: RouteCounters,
    /// Per checkpoint slot, where the engine view keeps its probe.
    pub(crate) probes: Box<[ProbeCell]>,
}

impl Policy {
    /// Parses and validates a whole policy; `env:VAR` keys are read from the process
    /// environment. Every problem is reported with its line and column.
    pub fn from_toml_str(src: &str) -> Result<Policy, PolicyError> {
        Self::from_toml_str_with_env(src, "<string>", &|var| std::env::var(var).ok())
    }

    /// As [`Policy::from_toml_str`], naming the source in errors and resolving `env:VAR`
    /// keys through `env` (tests pass a closure instead of touching the environment).
    pub fn from_toml_str_with_env(
        src: &str,
        source_name: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Policy, PolicyError> {
        crate::validate::compile(src, source_name, env)
    }

    /// Reads and validates a policy file.
    pub fn load(path: impl AsRef<Path>) -> Result<Policy, PolicyError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str_with_env(&src, &path.display().to_string(), &|var| {
            std::env::var(var).ok()
        })
    }

    /// Where the policy came from (a path or `<string>`).
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Utility weights and defaults.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// All models, in file order.
    /// How routing names checkpoint `model`/`version` (indices) to the engine view.
    pub(crate) fn checkpoint_key(&self, model: usize, version: usize) -> Option<CheckpointKey<'_>> {
        let m = self.models.get(model)?;
        Some(CheckpointKey {
            model: &m.name,
            version: m.versions.get(version)?,
            probe: self
                .probes
                .get(self.checkpoint_base.get(model)? + version)?,
        })
    }

    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// All tenants, in file order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// All splits, in file order.
    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    /// The model index a name or alias refers to.
    pub fn model_index(&self, name_or_alias: &str) -> Option<usize> {
        self.model_names.get(name_or_alias).copied()
    }

    /// A tenant by name.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenant_names
            .get(name)
            .and_then(|&i| self.tenants.get(i))
    }

    /// The tenant owning API key `key`, if any (hash lookup, constant-time confirm).
    pub fn authenticate(&self, key: &str) -> Option<&Tenant> {
        let d = keys::digest(key);
        let (stored, &index) = self.keys.get_key_value(&d)?;
        if keys::digests_equal(stored, &d) {
            self.tenants.get(index)
        } else {
            None
        }
    }

    /// Registers every tenant's spend counters with the installed metrics recorder, so
    /// each tenant's series exists (at 0) from now on and no tenant's first request
    /// pays for registering them. Call it once a recorder is installed (a policy loaded
    /// before that keeps no-op handles until its first requests otherwise).
    pub fn register_metrics(&self) {
        for tenant in &self.tenants {
            tenant.meter.register();
        }
    }

    /// The rollback state of every split that has a rule.
    pub fn rollback_status(&self) -> Vec<RollbackStatus> {
        self.splits
            .iter()
            .filter_map(|s| s.rollback().map(|m| m.status()))
            .collect()
    }

    /// Returns a split's rule to `Watching`; false if no split of that name has a rule.
    pub fn reset_rollback(&self, split: &str) -> bool {
        match self
            .splits
            .iter()
            .find(|s| &*s.name == split)
            .and_then(Split::rollback)
        {
            Some(m) => {
                m.reset();
                true
            }
            None => false,
        }
    }

    /// Keeps budget counters and rollback state from `old` wherever the same budget window
    /// or an unchanged split exists in both, so a reload neither resets spend nor forgets a
    /// rollback.
    pub(crate) fn inherit_state(&mut self, old: &Policy) {
        for tenant in &mut self.tenants {
            let Some(old_tenant) = old.tenant(&tenant.name) else {
                continue;
            };
            for window in &mut tenant.budgets {
                if let Some(kept) = old_tenant.budgets.iter().find(|o| o.same_window(window)) {
                    kept.set_limit(window.limit());
                    *window = Arc::clone(kept);
                }
            }
        }
        for split in &mut self.splits {
            if let Some(old_split) = old.splits.iter().find(|o| o.same_config(split)) {
                split.adopt_monitor(old_split);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_for_tags_takes_the_weakest() {
        let m = Model {
            name: "m".into(),
            versions: vec!["1".into()],
            active_version: 0,
            aliases: vec![],
            cost_per_1k_input: 0.0,
            cost_per_1k_output: 0.0,
            quality: 0.5,
            quality_by_tag: vec![("code".to_string(), 0.9), ("math".to_string(), 0.3)],
            context_limit: 10,
            latency_target_ms: None,
            max_queue_depth: None,
            split: None,
            fallback: None,
        };
        assert_eq!(m.quality_for(&[]), (0.5, None));
        assert_eq!(m.quality_for(&["code".into()]), (0.9, Some("code")));
        let tags = ["code".to_string(), "math".to_string(), "prose".to_string()];
        assert_eq!(m.quality_for(&tags), (0.3, Some("math")));
    }
}
