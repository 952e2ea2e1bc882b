//! LoRA adapters in the registry: registered and removed at run time, and
//! kept within a byte budget.
//!
//! An adapter's version is a version like any other (its weights are the
//! base's, shared through the weight store, plus the adapter's A and B), so
//! load, activate, rollback and unload are the registry's own. What is
//! particular to adapters lives here:
//! - [`Registry::add_adapter`] registers one at run time over a served base,
//!   loads it (every check of `adapter::load_adapter` against the base) and
//!   activates it; when the load fails nothing stays registered;
//! - [`Registry::remove_adapter`] forgets an adapter and all its versions;
//!   requests in flight finish on the versions they hold;
//! - the budget (`--lora-budget-mb`): a load that would take the resident
//!   adapters' bytes past it first evicts the least recently used adapters
//!   that no request is using (never one in use, never the one loading). An
//!   evicted adapter stays registered, and a request for it loads it again
//!   in the background (`reload.rs`), so the budget bounds memory, not which
//!   adapters can be asked for.

use std::sync::atomic::Ordering;

use switchyard_kernels::Backend;

use super::{file_bytes, lock, unknown_model, LoadReport, Model, Registry, State};
use crate::registry::error::RegistryError;
use crate::registry::registration::AdapterRegistration;
use crate::registry::status::{AdapterStatus, AdapterUsage, Tier};
use crate::serving::{AdapterSource, CheckpointId};

impl<B: Backend> Registry<B> {
    /// Registers `model@version` as the adapter `source` over the base
    /// checkpoint at `base_path` (startup and repository scans; loaded later).
    pub fn register_adapter(
        &self,
        model: &str,
        version: &str,
        base_path: &std::path::Path,
        source: AdapterSource,
    ) {
        self.register(model, version, base_path, &[]);
        // Routing weighs a reload by what it reads: the adapter's file, not
        // the base's (which stays resident under its other versions).
        let adapter_bytes = file_bytes(&source.path);
        let mut models = self.write();
        if let Some(slot) = models.get_mut(model).and_then(|m| m.slot_mut(version)) {
            slot.adapter = Some(source);
            slot.disk_bytes = adapter_bytes;
            slot.publish();
        }
    }

    /// Registers, loads and (when asked) activates an adapter over a served
    /// base. A corrupt or mismatched adapter is refused with the loader's
    /// message (the file, the tensor, the shapes) and leaves nothing behind.
    pub fn add_adapter(&self, asked: &AdapterRegistration) -> Result<LoadReport, RegistryError> {
        asked.check()?;
        let (base_path, parent) = self.base_for(asked)?;
        let created = {
            let models = self.write();
            let created = !models.contains_key(&asked.name);
            if let Some(entry) = models.get(&asked.name) {
                if entry.versions.iter().all(|s| entry.adapter_of(s).is_none()) {
                    return Err(RegistryError::conflict(format!(
                        "`{}` is a base model, not an adapter; choose another name",
                        asked.name
                    )));
                }
                if entry.slot(&asked.version).is_some() {
                    return Err(RegistryError::conflict(format!(
                        "adapter `{}` has a version `{}` already; give another version, or \
                         DELETE /admin/adapters/{} first",
                        asked.name, asked.version, asked.name
                    )));
                }
            }
            let options = models.get(&parent).map(|m| m.options.clone());
            drop(models);
            let source = AdapterSource {
                path: asked.path.clone(),
                parent: parent.clone(),
            };
            self.register_adapter(&asked.name, &asked.version, &base_path, source);
            if created {
                // The base's chat template and context window, not its adapter.
                let options =
                    options.map(|o| crate::serving::CheckpointOptions { adapter: None, ..o });
                self.configure(&asked.name, options.unwrap_or_default());
            }
            created
        };
        let report = match self.load(&asked.name, &asked.version) {
            Ok(report) => report,
            Err(error) => {
                self.forget_version(&asked.name, &asked.version, created);
                return Err(error);
            }
        };
        let has_active = self
            .read()
            .get(&asked.name)
            .is_some_and(|m| m.active.is_some());
        if asked.activate || !has_active {
            self.activate(&asked.name, &asked.version)?;
        }
        Ok(report)
    }

    /// The base checkpoint's file and the base's name for an adapter over
    /// `asked.base` (its active version).
    fn base_for(
        &self,
        asked: &AdapterRegistration,
    ) -> Result<(std::path::PathBuf, String), RegistryError> {
        let models = self.read();
        let (name, base) = models
            .get_key_value(&asked.base)
            .or_else(|| models.iter().find(|(_, m)| m.aliases.contains(&asked.base)))
            .ok_or_else(|| unknown_model(&asked.base))?;
        let active = base.active.as_deref().and_then(|v| base.slot(v));
        let Some(slot) = active.filter(|s| base.adapter_of(s).is_none()) else {
            return Err(RegistryError::invalid(format!(
                "`base` `{}` is not a served base model (an adapter, or no active version); \
                 name the model the adapter was trained for",
                asked.base
            )));
        };
        Ok((slot.path.clone(), name.clone()))
    }

    /// Drops `model@version` from the registry (and `model` when it has no
    /// version left and `whole` allows it).
    fn forget_version(&self, model: &str, version: &str, whole: bool) {
        let mut models = self.write();
        if let Some(entry) = models.get_mut(model) {
            entry.versions.retain(|s| s.version != version);
            if whole && entry.versions.is_empty() {
                models.remove(model);
            }
        }
    }

    /// Forgets the adapter `name` and every version of it. Returns how many
    /// requests are still running on it (they finish on what they hold).
    pub fn remove_adapter(&self, name: &str) -> Result<usize, RegistryError> {
        let _no_load_meanwhile = lock(&self.loading);
        let mut models = self.write();
        let entry = models.get(name).ok_or_else(|| unknown_model(name))?;
        if entry.versions.iter().any(|s| entry.adapter_of(s).is_none()) {
            return Err(RegistryError::conflict(format!(
                "`{name}` is a base model, not an adapter; unload its versions through \
                 /admin/models instead"
            )));
        }
        let Some(mut entry) = models.remove(name) else {
            return Err(unknown_model(name));
        };
        drop(models);
        let mut draining = 0;
        for slot in &mut entry.versions {
            if let State::Resident(handle) = &slot.state {
                draining += handle.demand();
                let id = handle.id.clone();
                slot.set_state(State::Disk);
                self.observer.unloaded(&id, false);
            }
        }
        tracing::info!(adapter = name, draining, "adapter removed");
        Ok(draining)
    }

    /// Evicts idle adapters, least recently used first, until `needed` more
    /// bytes fit the adapter budget; the adapters evicted.
    pub(super) fn make_adapter_room(
        &self,
        loading: &CheckpointId,
        needed: u64,
    ) -> Result<Vec<CheckpointId>, RegistryError> {
        let Some(budget) = self.adapter_budget else {
            return Ok(Vec::new());
        };
        if needed > budget {
            return Err(RegistryError::unavailable(format!(
                "{loading} holds {needed} bytes of adapter weights, more than the whole adapter \
                 budget of {budget} bytes; raise --lora-budget-mb"
            )));
        }
        let mut evicted = Vec::new();
        loop {
            let mut models = self.write();
            let resident = resident_adapters(&models, loading);
            let held: u64 = resident.iter().map(|r| r.bytes).sum();
            if held.saturating_add(needed) <= budget {
                return Ok(evicted);
            }
            // Never one in use: a request holding it would keep its memory anyway.
            let victim = resident
                .iter()
                .filter(|r| r.demand == 0)
                .max_by_key(|r| r.idle_ms)
                .map(|r| (r.id.clone(), r.bytes));
            let Some((victim, victim_bytes)) = victim else {
                return Err(budget_full(loading, needed, budget, &resident));
            };
            if let Some(slot) = models
                .get_mut(&victim.model)
                .and_then(|m| m.slot_mut(&victim.version))
            {
                slot.set_state(State::Disk);
                slot.evicted = true;
                slot.evicted_bytes = victim_bytes;
            }
            drop(models);
            self.adapter_evictions.fetch_add(1, Ordering::Relaxed);
            tracing::info!(adapter = %victim, "evicted (least recently used) to fit the adapter budget");
            self.observer.unloaded(&victim, true);
            evicted.push(victim);
        }
    }

    /// Whether `needed` more adapter bytes fit the budget for `loading`
    /// once the idle adapters are evicted, without evicting them: the
    /// budget-full error [`Registry::make_adapter_room`] would give, if not.
    pub(super) fn adapter_room(
        &self,
        loading: &CheckpointId,
        needed: u64,
    ) -> Result<(), RegistryError> {
        let Some(budget) = self.adapter_budget else {
            return Ok(());
        };
        let models = self.read();
        let resident = resident_adapters(&models, loading);
        let busy: u64 = (resident.iter())
            .filter(|r| r.demand > 0)
            .map(|r| r.bytes)
            .sum();
        if busy.saturating_add(needed) <= budget {
            Ok(())
        } else {
            Err(budget_full(loading, needed, budget, &resident))
        }
    }

    /// Every adapter version and the budget they share.
    pub fn adapter_usage(&self) -> AdapterUsage {
        let models = self.read();
        let mut adapters = Vec::new();
        for (name, model) in models.iter() {
            for slot in &model.versions {
                let Some(source) = model.adapter_of(slot) else {
                    continue;
                };
                let handle = match &slot.state {
                    State::Resident(h) => Some(h),
                    _ => None,
                };
                adapters.push(AdapterStatus {
                    name: name.clone(),
                    version: slot.version.clone(),
                    parent: source.parent.clone(),
                    path: source.path.display().to_string(),
                    active: model.active.as_deref() == Some(slot.version.as_str()),
                    resident: handle.is_some(),
                    bytes: handle
                        .and_then(|h| h.adapter.as_ref())
                        .map_or(0, |a| a.bytes()),
                    running: handle.map_or(0, |h| h.demand().saturating_sub(h.queued())),
                    waiting: handle.map_or(0, |h| h.queued()),
                    loading: handle.is_none() && slot.tier() == Tier::Loading,
                    idle_ms: handle.map_or(0, |h| millis(h.idle_for())),
                });
            }
        }
        AdapterUsage {
            budget_bytes: self.adapter_budget,
            resident_bytes: adapters.iter().map(|a| a.bytes).sum(),
            evictions: self.adapter_evictions.load(Ordering::Relaxed),
            adapters,
        }
    }
}

/// A resident adapter version, as the budget weighs it.
struct ResidentAdapterSlot {
    id: CheckpointId,
    bytes: u64,
    demand: usize,
    idle_ms: u64,
}

/// The refusal of `needed` bytes for `loading` while the adapters in use
/// hold the budget.
fn budget_full(
    loading: &CheckpointId,
    needed: u64,
    budget: u64,
    resident: &[ResidentAdapterSlot],
) -> RegistryError {
    let in_use = || resident.iter().filter(|r| r.demand > 0);
    let busy: Vec<String> = in_use().map(|r| r.id.to_string()).collect();
    let held: u64 = in_use().map(|r| r.bytes).sum();
    RegistryError::unavailable(format!(
        "loading {loading} needs {needed} bytes of the {budget}-byte adapter budget, but {held} \
         are held by adapters in use ({}); retry when they finish or raise --lora-budget-mb",
        busy.join(", ")
    ))
}

/// The resident adapter versions other than `loading`.
fn resident_adapters<B: Backend>(
    models: &std::collections::BTreeMap<String, Model<B>>,
    loading: &CheckpointId,
) -> Vec<ResidentAdapterSlot> {
    let mut out = Vec::new();
    for model in models.values() {
        for slot in &model.versions {
            let State::Resident(handle) = &slot.state else {
                continue;
            };
            let Some(adapter) = handle.adapter.as_ref() else {
                continue;
            };
            if handle.id == *loading {
                continue;
            }
            out.push(ResidentAdapterSlot {
                id: handle.id.clone(),
                bytes: adapter.bytes(),
                demand: handle.demand(),
                idle_ms: millis(handle.idle_for()),
            });
        }
    }
    out
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
