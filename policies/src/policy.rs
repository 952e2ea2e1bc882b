//! A loaded policy: the compiled policy (what the file says, never changed) and the live
//! state it feeds (spend, rollback monitors, probes, counters). A reload builds a new
//! compiled policy and carries the live state over to it wherever it still applies.

use std::path::Path;
use std::sync::Arc;

use crate::compiled::model::Model;
use crate::compiled::split::Split;
use crate::compiled::tenant::Tenant;
use crate::compiled::{CompiledPolicy, Routing};
use crate::engine_view::CheckpointKey;
use crate::error::PolicyError;
use crate::ledger::{Ledger, MemoryLedger};
use crate::live::budget::BudgetWindow;
use crate::live::rollback::{RollbackMonitor, RollbackStatus};
use crate::live::LiveState;

/// A validated policy and its live state. Build one with [`Policy::from_toml_str`] or
/// [`Policy::load`]; route with [`crate::route`].
#[derive(Debug)]
pub struct Policy {
    pub(crate) compiled: CompiledPolicy,
    pub(crate) live: LiveState,
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
        let mut compiled = crate::validate::compile(src, source_name, env)?;
        // Until a source is given, every `quality_from` says what it lacks.
        crate::compiled::measured::resolve(&mut compiled, &crate::measured::NoMeasurements);
        Ok(Policy {
            live: LiveState::new(&compiled, Arc::new(MemoryLedger::new())),
            compiled,
        })
    }

    /// This policy with its budgets counted in `ledger` (a fresh policy keeps them in
    /// memory). [`crate::PolicyStore`] gives every policy it installs its ledger.
    pub fn with_ledger(mut self, ledger: Arc<dyn Ledger>) -> Policy {
        self.live.use_ledger(&self.compiled, ledger);
        self
    }

    /// The ledger this policy's budgets are counted in.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.live.ledger
    }

    /// This policy with every `quality_from` figure taken from `source` (see
    /// [`crate::QualitySource`]): fresh measurements of the active versions replace the
    /// declared figures; `policy explain` shows where each came from.
    pub fn resolve_quality(mut self, source: &dyn crate::measured::QualitySource) -> Policy {
        crate::compiled::measured::resolve(&mut self.compiled, source);
        self.roll_back_on_evals();
        self
    }

    /// Trips the rollback rule of every split whose arms' stored evaluations show the
    /// candidate too far below the baseline (see `eval_suite` / `max_eval_drop`).
    pub(crate) fn roll_back_on_evals(&self) {
        for (split, monitor) in self.compiled.splits.iter().zip(&self.live.rollbacks) {
            if let (Some(reason), Some(monitor)) = (&split.eval_verdict, monitor) {
                monitor.trip("eval", reason.clone());
            }
        }
    }

    /// Counts a client's score of an answer that split `split`'s arm `arm` gave, for the
    /// split's rollback rule (no-op when the split, the arm or the rule is gone).
    pub fn record_arm_feedback(&self, split: &str, arm: &str, score: f64) {
        let Some(index) = self.compiled.split_index(split) else {
            return;
        };
        let Some(arm) = self
            .compiled
            .splits
            .get(index)
            .and_then(|s| s.arms.iter().position(|a| &*a.name == arm))
        else {
            return;
        };
        if let Some(monitor) = self.live.rollback(index) {
            monitor.record_feedback(arm, score);
        }
    }

    /// Whether some split compares its arms' stored evaluations.
    pub fn uses_split_evals(&self) -> bool {
        self.compiled
            .splits
            .iter()
            .any(|s| s.rollback().is_some_and(|r| r.eval.is_some()))
    }

    /// Whether some model takes its quality from a measurement.
    pub fn uses_measured_quality(&self) -> bool {
        self.compiled
            .models
            .iter()
            .any(|m| m.quality_from.is_some())
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
        &self.compiled.source_name
    }

    /// Utility weights and defaults.
    pub fn routing(&self) -> &Routing {
        &self.compiled.routing
    }

    /// All models, in file order.
    pub fn models(&self) -> &[Model] {
        &self.compiled.models
    }

    /// All tenants, in file order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.compiled.tenants
    }

    /// The `[cascade]` `auto` requests go through, if any.
    pub fn cascade(&self) -> Option<&crate::compiled::cascade::Cascade> {
        self.compiled.cascade.as_ref()
    }

    /// All splits, in file order.
    pub fn splits(&self) -> &[Split] {
        &self.compiled.splits
    }

    /// The model index a name or alias refers to.
    pub fn model_index(&self, name_or_alias: &str) -> Option<usize> {
        self.compiled.model_names.get(name_or_alias).copied()
    }

    /// The part of the engine's KV budget and queue, in thousandths, that the
    /// requests of `tenant` (`None`: anonymous callers, together) may hold: the
    /// tenant's `kv_share`, else half when two or more callers can compete (two
    /// tenants, or one and anonymous callers), else all of it.
    pub fn kv_permille(&self, tenant: Option<&str>) -> u16 {
        let own = tenant.and_then(|name| self.tenant(name)?.kv_share);
        let callers = self.compiled.tenants.len() + usize::from(self.routing().allow_anonymous);
        own.unwrap_or(if callers >= 2 { 500 } else { 1000 })
    }

    /// A tenant by name.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.compiled
            .tenant_index(name)
            .and_then(|i| self.compiled.tenants.get(i))
    }

    /// The tenant owning API key `key`, if any (hash lookup, constant-time confirm).
    pub fn authenticate(&self, key: &str) -> Option<&Tenant> {
        self.compiled
            .key_owner(key)
            .and_then(|i| self.compiled.tenants.get(i))
    }

    /// The current windows of tenant `tenant`'s budgets, in the order of
    /// [`Tenant::budgets`]; `None` if no tenant has that name.
    pub fn budgets(&self, tenant: &str) -> Option<&[Arc<BudgetWindow>]> {
        let i = self.compiled.tenant_index(tenant)?;
        Some(&self.live.tenants.get(i)?.budgets)
    }

    /// The monitor of split `split`'s rollback rule; `None` if no split of that name has
    /// a rule.
    pub fn rollback_monitor(&self, split: &str) -> Option<&Arc<RollbackMonitor>> {
        self.live.rollback(self.compiled.split_index(split)?)
    }

    /// Registers every tenant's spend counters with the installed metrics recorder, so
    /// each tenant's series exists (at 0) from now on and no tenant's first request
    /// pays for registering them. Call it once a recorder is installed (a policy loaded
    /// before that keeps no-op handles until its first requests otherwise).
    pub fn register_metrics(&self) {
        for tenant in &self.live.tenants {
            tenant.meter.register();
        }
    }

    /// The rollback state of every split that has a rule.
    pub fn rollback_status(&self) -> Vec<RollbackStatus> {
        self.live
            .rollbacks
            .iter()
            .flatten()
            .map(|m| m.status())
            .collect()
    }

    /// Returns a split's rule to `Watching`; false if no split of that name has a rule.
    pub fn reset_rollback(&self, split: &str) -> bool {
        match self.rollback_monitor(split) {
            Some(m) => {
                m.reset();
                true
            }
            None => false,
        }
    }

    /// How routing names checkpoint `model`/`version` (indices) to the engine view.
    #[inline]
    pub(crate) fn checkpoint_key(&self, model: usize, version: usize) -> Option<CheckpointKey<'_>> {
        let m = self.compiled.models.get(model)?;
        Some(CheckpointKey {
            model: &m.name,
            version: m.versions.get(version)?,
            probe: self
                .live
                .probes
                .get(self.compiled.checkpoint_slot(model, version)?)?,
        })
    }

    /// Keeps budget counters and rollback state from `old` wherever the same budget window
    /// or an unchanged split exists in both, so a reload neither resets spend nor forgets a
    /// rollback.
    pub(crate) fn inherit_state(&mut self, old: &Policy) {
        let tenants = self.compiled.tenants.iter().zip(&mut self.live.tenants);
        for (tenant, state) in tenants {
            let Some(o) = old.compiled.tenant_index(&tenant.name) else {
                continue;
            };
            let (Some(old_tenant), Some(old_state)) =
                (old.compiled.tenants.get(o), old.live.tenants.get(o))
            else {
                continue;
            };
            for (budget, window) in tenant.budgets.iter().zip(&mut state.budgets) {
                let kept = old_tenant
                    .budgets
                    .iter()
                    .zip(&old_state.budgets)
                    .find(|(o, _)| o.same_window(budget));
                if let Some((_, kept)) = kept {
                    kept.set_limit(budget.limit());
                    *window = Arc::clone(kept);
                }
            }
        }
        let splits = self.compiled.splits.iter().zip(&mut self.live.rollbacks);
        for (split, monitor) in splits {
            let kept = old
                .compiled
                .splits
                .iter()
                .zip(&old.live.rollbacks)
                .find(|(o, _)| o.same_config(split));
            if let Some((_, Some(kept))) = kept {
                *monitor = Some(Arc::clone(kept));
            }
        }
    }
}
