//! The registry of model versions and their lifecycle.

mod adapters;
mod demotion;
mod reload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use switchyard_kernels::{Backend, KvFormat, KvType, WeightTier};
use switchyard_seam::ModelSpec;

use super::error::RegistryError;
use super::live::LiveSlot;
use super::residency::{eviction_order, EvictionCandidate};
use super::status::{MemoryStatus, ModelStatus, RoutingState, Tier, VersionStatus};
use crate::chat_choice;
use crate::formats::load_checkpoint;
use crate::model::config::ModelConfig;
use crate::serving::{
    AdapterSource, CheckpointHandle, CheckpointId, CheckpointOptions, ServedCheckpoint,
};
use crate::store::WeightStore;
use crate::tokenizer::Tokenizer;

/// Hears lifecycle events (for metrics and logs).
pub trait RegistryObserver: Send + Sync {
    /// A load finished (`error` is `None` when it succeeded).
    fn load(&self, id: &CheckpointId, elapsed: Duration, error: Option<&str>) {
        let _ = (id, elapsed, error);
    }

    /// `model`'s active version is now `version` (after `previous`).
    fn activated(&self, model: &str, version: &str, previous: Option<&str>) {
        let _ = (model, version, previous);
    }

    /// `id` left RAM (unloaded or evicted).
    fn unloaded(&self, id: &CheckpointId, evicted: bool) {
        let _ = (id, evicted);
    }
}

struct Quiet;
impl RegistryObserver for Quiet {}

/// What a successful load did.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    pub id: CheckpointId,
    pub elapsed: Duration,
    /// Bytes of its tensors, and how many it shares with other checkpoints.
    pub bytes: u64,
    pub shared_bytes: u64,
    /// Versions evicted to make room.
    pub evicted: Vec<CheckpointId>,
    /// Whether it was resident already (nothing done).
    pub already_resident: bool,
    /// Which chat template it serves with and why.
    pub template: String,
}

enum State<B: Backend> {
    Disk,
    Loading,
    Resident(CheckpointHandle<B>),
}

struct Slot<B: Backend> {
    version: String,
    path: PathBuf,
    /// Bytes of `path` when it was registered: routing reads this for every
    /// candidate of every request, where a `stat` (a directory listing for
    /// sharded checkpoints) each time would cost more than the routing itself.
    disk_bytes: u64,
    /// `state` as routing reads it without the registry's lock.
    live: Arc<LiveSlot<B>>,
    state: State<B>,
    last_error: Option<String>,
    /// The LoRA adapter this version serves over `path` (a base checkpoint),
    /// when it differs from the model's (`CheckpointOptions::adapter`):
    /// repository and admin-registered adapters give each version its own.
    adapter: Option<AdapterSource>,
    /// Evicted by the adapter budget: the next request for it loads it
    /// again (see `adapters.rs`).
    evicted: bool,
    /// The adapter bytes it held when the budget evicted it: what loading
    /// it again needs from the budget.
    evicted_bytes: u64,
    /// A background load of it again is queued or running for requests
    /// (`reload.rs`): it reads as loading, and new requests wait for it.
    reload_pending: bool,
}

struct Model<B: Backend> {
    aliases: Vec<String>,
    /// How its versions are served (chat template), set by [`Registry::configure`].
    options: CheckpointOptions,
    /// Ordered by [`version_order`].
    versions: Vec<Slot<B>>,
    active: Option<String>,
    /// Previously active versions, most recent last.
    history: Vec<String>,
}

impl<B: Backend> Slot<B> {
    /// Moves the slot to `state` and publishes it to routing.
    fn set_state(&mut self, state: State<B>) {
        self.state = state;
        self.publish();
    }

    /// Publishes the slot's state to routing; a version queued for a
    /// reload reads as loading.
    fn publish(&self) {
        match &self.state {
            State::Resident(handle) => self.live.publish(
                Tier::loaded::<B>(handle.placement()),
                handle.load_stats.total_bytes,
                Some(Arc::clone(handle)),
            ),
            State::Loading => self.live.publish(Tier::Loading, self.disk_bytes, None),
            State::Disk if self.reload_pending => {
                self.live.publish(Tier::Loading, self.disk_bytes, None)
            }
            State::Disk => self.live.publish(Tier::Disk, self.disk_bytes, None),
        }
    }

    /// Its tier as status and metrics report it.
    fn tier(&self) -> Tier {
        match &self.state {
            State::Resident(handle) => Tier::loaded::<B>(handle.placement()),
            State::Loading => Tier::Loading,
            State::Disk if self.reload_pending => Tier::Loading,
            State::Disk => Tier::Disk,
        }
    }
}

impl<B: Backend> Model<B> {
    /// The adapter `slot` serves, if it is an adapter's version.
    fn adapter_of<'a>(&'a self, slot: &'a Slot<B>) -> Option<&'a AdapterSource> {
        slot.adapter.as_ref().or(self.options.adapter.as_ref())
    }

    fn slot(&self, version: &str) -> Option<&Slot<B>> {
        self.versions.iter().find(|s| s.version == version)
    }

    fn slot_mut(&mut self, version: &str) -> Option<&mut Slot<B>> {
        self.versions.iter_mut().find(|s| s.version == version)
    }

    /// The version [`Registry::rollback`] would make active now: the most recent
    /// earlier active version that is still resident.
    fn rollback_target(&self) -> Option<&str> {
        let current = self.active.as_deref()?;
        self.history
            .iter()
            .rev()
            .map(String::as_str)
            .find(|v| *v != current && self.resident(v).is_some())
    }

    fn resident(&self, version: &str) -> Option<&CheckpointHandle<B>> {
        match self.slot(version).map(|s| &s.state) {
            Some(State::Resident(handle)) => Some(handle),
            _ => None,
        }
    }
}

/// Numeric versions in numeric order, then the others in lexical order.
fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// Every known model version, which are resident, and which is active.
pub struct Registry<B: Backend> {
    backend: Arc<B>,
    store: WeightStore<B>,
    ram_budget: Option<u64>,
    /// The KV format versions are checked against at load (the executor's).
    kv_format: KvFormat,
    models: RwLock<BTreeMap<String, Model<B>>>,
    /// One load at a time: loads compete for memory and cores, and the
    /// budget check must see the result of the previous one.
    loading: Mutex<()>,
    observer: Arc<dyn RegistryObserver>,
    /// Bytes resident adapters may hold (`--lora-budget-mb`); least
    /// recently used adapters with no request are evicted past it.
    adapter_budget: Option<u64>,
    /// Adapters evicted by that budget so far.
    adapter_evictions: std::sync::atomic::AtomicU64,
}

impl<B: Backend> Registry<B> {
    /// An empty registry loading into `backend`, keeping resident tensors
    /// under `ram_budget` bytes when set.
    pub fn new(backend: Arc<B>, ram_budget: Option<u64>) -> Self {
        Registry {
            backend,
            store: WeightStore::new(),
            ram_budget,
            kv_format: KvFormat::of(KvType::default()),
            models: RwLock::new(BTreeMap::new()),
            loading: Mutex::new(()),
            observer: Arc::new(Quiet),
            adapter_budget: None,
            adapter_evictions: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Checks every version at load against KV caches of `format` (the
    /// executor's; the default: F16 in blocks of the default size).
    pub fn with_kv_format(mut self, format: KvFormat) -> Self {
        self.kv_format = format;
        self
    }

    /// Keeps resident LoRA adapters under `bytes` (see `adapters.rs`).
    pub fn with_adapter_budget(mut self, bytes: Option<u64>) -> Self {
        self.adapter_budget = bytes;
        self
    }

    /// Reports lifecycle events to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn RegistryObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The weight store every version loads through.
    pub fn store(&self) -> &WeightStore<B> {
        &self.store
    }

    /// The backend every version is loaded into (to run a resident
    /// version outside the executor: evaluation suites).
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Makes `model@version` known (on disk at `path`); aliases are added
    /// to the model's. Registering a known version again updates its path.
    pub fn register(&self, model: &str, version: &str, path: &Path, aliases: &[String]) {
        let mut models = self.write();
        let entry = models.entry(model.to_owned()).or_insert_with(|| Model {
            aliases: Vec::new(),
            options: CheckpointOptions::default(),
            versions: Vec::new(),
            active: None,
            history: Vec::new(),
        });
        for alias in aliases {
            if !entry.aliases.contains(alias) {
                entry.aliases.push(alias.clone());
            }
        }
        let disk_bytes = file_bytes(path);
        match entry.slot_mut(version) {
            Some(slot) => {
                slot.path = path.to_path_buf();
                slot.disk_bytes = disk_bytes;
                slot.publish();
            }
            None => {
                entry.versions.push(Slot {
                    version: version.to_owned(),
                    path: path.to_path_buf(),
                    disk_bytes,
                    live: Arc::new(LiveSlot::on_disk(disk_bytes)),
                    state: State::Disk,
                    last_error: None,
                    adapter: None,
                    evicted: false,
                    evicted_bytes: 0,
                    reload_pending: false,
                });
                entry
                    .versions
                    .sort_by(|a, b| version_order(&a.version, &b.version));
            }
        }
    }

    /// Sets how `model`'s versions are served from their next load on (the
    /// operator's chat template); `false` when `model` is not registered.
    pub fn configure(&self, model: &str, options: CheckpointOptions) -> bool {
        match self.write().get_mut(model) {
            Some(entry) => {
                entry.options = options;
                true
            }
            None => false,
        }
    }

    /// Reads `model@version` into RAM beside whatever is active, checks it
    /// (format, tokenizer, shapes, a smoke forward, and that it matches the
    /// model's active version), evicting idle versions if the budget needs
    /// room. On failure nothing changes and the error says why.
    pub fn load(&self, model: &str, version: &str) -> Result<LoadReport, RegistryError> {
        let _one_at_a_time = lock(&self.loading);
        let id = CheckpointId::new(model, version);
        let (path, options) = {
            let mut models = self.write();
            let entry = models.get_mut(model).ok_or_else(|| unknown_model(model))?;
            let mut options = entry.options.clone();
            let slot = entry
                .slot_mut(version)
                .ok_or_else(|| unknown_version(model, version))?;
            if slot.adapter.is_some() {
                options.adapter = slot.adapter.clone();
            }
            match &slot.state {
                State::Resident(handle) => {
                    return Ok(LoadReport {
                        id,
                        elapsed: Duration::ZERO,
                        bytes: handle.load_stats.total_bytes,
                        shared_bytes: handle.load_stats.shared_bytes,
                        evicted: Vec::new(),
                        already_resident: true,
                        template: handle.template_origin.to_string(),
                    })
                }
                State::Loading => {
                    return Err(RegistryError::conflict(format!(
                        "{id} is already loading; wait for that load to finish"
                    )))
                }
                State::Disk => {}
            }
            slot.set_state(State::Loading);
            (slot.path.clone(), options)
        };
        tracing::info!(checkpoint = %id, path = %path.display(), "loading");
        // A panic while loading (a bug, or a file no check caught) must not leave the
        // slot "loading" for good: it fails this load like any other error.
        let result = panic_as_error(&id, &path, || self.load_unlocked(&id, &path, &options));
        let mut models = self.write();
        let slot = models
            .get_mut(model)
            .and_then(|m| m.slot_mut(version))
            .ok_or_else(|| unknown_version(model, version))?;
        match result {
            Ok((handle, evicted)) => {
                let report = LoadReport {
                    id: id.clone(),
                    elapsed: handle.load_time,
                    bytes: handle.load_stats.total_bytes,
                    shared_bytes: handle.load_stats.shared_bytes,
                    evicted,
                    already_resident: false,
                    template: handle.template_origin.to_string(),
                };
                slot.set_state(State::Resident(handle));
                slot.last_error = None;
                slot.evicted = false;
                drop(models);
                tracing::info!(
                    checkpoint = %id,
                    ms = report.elapsed.as_secs_f64() * 1e3,
                    bytes = report.bytes,
                    shared_bytes = report.shared_bytes,
                    "loaded"
                );
                self.observer.load(&id, report.elapsed, None);
                Ok(report)
            }
            Err(error) => {
                slot.set_state(State::Disk);
                slot.last_error = Some(error.message.clone());
                drop(models);
                // Info, not warn: the error goes back to the caller (startup, the admin
                // API), which reports it; a warning here printed it twice.
                tracing::info!(checkpoint = %id, %error, "load failed; nothing changed");
                self.observer
                    .load(&id, Duration::ZERO, Some(&error.message));
                Err(error)
            }
        }
    }

    fn load_unlocked(
        &self,
        id: &CheckpointId,
        path: &Path,
        options: &CheckpointOptions,
    ) -> Result<(CheckpointHandle<B>, Vec<CheckpointId>), RegistryError> {
        let estimate = file_bytes(path);
        if self.ram_budget.is_some() {
            // Making room evicts versions: check first what can be checked without the
            // weights, so that a bad file does not cost a good version its place.
            self.precheck(id, path, options)?;
        }
        let mut evicted = self.make_room(id, estimate)?;
        let checkpoint = ServedCheckpoint::load(
            self.backend.as_ref(),
            &self.store,
            id.clone(),
            path,
            options,
            self.kv_format,
        )
        .map_err(|e| RegistryError::invalid(format!("cannot load {id}: {e}")))?;
        self.check_matches_active(&checkpoint)?;
        if let Some(adapter) = &checkpoint.adapter {
            evicted.extend(self.make_adapter_room(id, adapter.bytes())?);
        }
        Ok((Arc::new(checkpoint), evicted))
    }

    /// Reads `path`'s header, tokenizer and chat template and checks its shape against
    /// the model's active version: what a load would refuse before reading weights.
    fn precheck(
        &self,
        id: &CheckpointId,
        path: &Path,
        options: &CheckpointOptions,
    ) -> Result<(), RegistryError> {
        let refuse = |what: &str, reason: String| {
            RegistryError::invalid(format!(
                "cannot load {id}: {what} of {} is unusable: {reason}",
                path.display()
            ))
        };
        let mut checkpoint =
            load_checkpoint(path).map_err(|e| refuse("the file", e.to_string()))?;
        options
            .apply(&mut checkpoint.config)
            .map_err(|e| refuse("the configuration", e))?;
        checkpoint
            .config
            .validate()
            .map_err(|e| refuse("the configuration", e))?;
        let tokenizer = Tokenizer::load(&checkpoint.tokenizer)
            .map_err(|e| refuse("the tokenizer", e.to_string()))?;
        chat_choice::choose(
            options.chat_template.as_ref(),
            &tokenizer,
            Some(checkpoint.config.architecture),
        )
        .map_err(|e| refuse("the chat template", e.to_string()))?;
        self.check_config_matches_active(id, path, &checkpoint.config, tokenizer.vocab_size())
    }

    /// A new version must be a drop-in for the active one: same
    /// architecture, shapes, vocabulary and tokenizer size (only the tensor
    /// types and values may differ), so that clients' prompts, token ids
    /// and context limits mean the same on both.
    fn check_matches_active(&self, candidate: &ServedCheckpoint<B>) -> Result<(), RegistryError> {
        self.check_config_matches_active(
            &candidate.id,
            &candidate.source,
            candidate.model.config(),
            candidate.tokenizer.vocab_size(),
        )
    }

    /// [`Self::check_matches_active`] for a configuration and vocabulary size.
    fn check_config_matches_active(
        &self,
        id: &CheckpointId,
        source: &Path,
        new: &ModelConfig,
        new_tokenizer_vocab: usize,
    ) -> Result<(), RegistryError> {
        let models = self.read();
        let Some(active) = models
            .get(&id.model)
            .and_then(|m| m.active.as_deref().and_then(|v| m.resident(v)))
        else {
            return Ok(());
        };
        let old = active.model.config();
        let mismatch =
            if new.architecture != old.architecture {
                Some(format!(
                    "architecture {} differs from the active {}'s {}",
                    new.architecture.name(),
                    active.id,
                    old.architecture.name()
                ))
            } else if new.vocab_size != old.vocab_size
                || new_tokenizer_vocab != active.tokenizer.vocab_size()
            {
                Some(format!(
                    "its vocabulary ({} tokens) differs from the active {}'s ({} tokens)",
                    new.vocab_size, active.id, old.vocab_size
                ))
            } else if (
                new.hidden_size,
                new.n_layers,
                new.n_heads,
                new.n_kv_heads,
                new.head_dim,
            ) != (
                old.hidden_size,
                old.n_layers,
                old.n_heads,
                old.n_kv_heads,
                old.head_dim,
            ) {
                Some(format!(
                "its shape (hidden {}, {} layers, {}/{} heads of {}) differs from the active {}'s \
                 (hidden {}, {} layers, {}/{} heads of {})",
                new.hidden_size, new.n_layers, new.n_heads, new.n_kv_heads, new.head_dim,
                active.id,
                old.hidden_size, old.n_layers, old.n_heads, old.n_kv_heads, old.head_dim
            ))
            } else {
                None
            };
        match mismatch {
            Some(reason) => Err(RegistryError::invalid(format!(
                "{} ({}) does not match model `{}`: {reason}; publish it as a new model instead",
                id,
                source.display(),
                id.model
            ))),
            None => Ok(()),
        }
    }

    /// Evicts idle non-active versions until `needed` more bytes fit the budget.
    fn make_room(
        &self,
        loading: &CheckpointId,
        needed: u64,
    ) -> Result<Vec<CheckpointId>, RegistryError> {
        let Some(budget) = self.ram_budget else {
            return Ok(Vec::new());
        };
        let mut evicted = Vec::new();
        let mut waited = false;
        loop {
            let resident = self.device_bytes();
            if resident.saturating_add(needed) <= budget {
                return Ok(evicted);
            }
            if let Some(victim) = self.pick_victim(loading) {
                self.evict(&victim);
                evicted.push(victim);
                continue;
            }
            if !waited {
                // Evicted versions still running sequences (or still in the
                // executor's weight table) give their bytes back when those
                // finish; give them a moment.
                waited = true;
                let deadline = std::time::Instant::now() + Duration::from_secs(2);
                while self.device_bytes().saturating_add(needed) > budget
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            return Err(RegistryError::unavailable(format!(
                "loading {loading} needs about {needed} bytes but {resident} of the {budget}-byte \
                 RAM budget are held by active or busy versions; unload a version or raise \
                 the budget (--ram-budget-mb)"
            )));
        }
    }

    fn pick_victim(&self, loading: &CheckpointId) -> Option<CheckpointId> {
        let models = self.read();
        let mut ids = Vec::new();
        let mut candidates = Vec::new();
        for (name, model) in models.iter() {
            let rollback_target = model.rollback_target();
            for slot in &model.versions {
                let State::Resident(handle) = &slot.state else {
                    continue;
                };
                let is_active = model.active.as_deref() == Some(slot.version.as_str());
                // The version a rollback would return to stays: evicting it would turn
                // the operator's way back into a 409.
                let is_rollback_target = rollback_target == Some(slot.version.as_str());
                // A version in the host tier holds no device memory.
                let on_device = handle.placement() == WeightTier::Resident;
                if is_active || is_rollback_target || handle.id == *loading || !on_device {
                    continue;
                }
                candidates.push(EvictionCandidate {
                    index: ids.len(),
                    demand: handle.demand(),
                    bytes: handle
                        .load_stats
                        .total_bytes
                        .saturating_sub(handle.load_stats.shared_bytes),
                    idle: handle.idle_for(),
                });
                ids.push(CheckpointId::new(name.clone(), slot.version.clone()));
            }
        }
        let first = eviction_order(candidates).into_iter().next()?;
        ids.get(first.index).cloned()
    }

    fn evict(&self, id: &CheckpointId) {
        // A backend with a host tier keeps an idle version there.
        if self.demote(id) {
            return;
        }
        let mut models = self.write();
        if let Some(slot) = models
            .get_mut(&id.model)
            .and_then(|m| m.slot_mut(&id.version))
        {
            slot.set_state(State::Disk);
        }
        drop(models);
        tracing::info!(checkpoint = %id, "evicted to make room");
        self.observer.unloaded(id, true);
    }

    /// Makes `model@version` (resident) the one new requests get. Requests
    /// in flight finish on the version they started on.
    pub fn activate(&self, model: &str, version: &str) -> Result<Option<String>, RegistryError> {
        let mut models = self.write();
        let entry = models.get_mut(model).ok_or_else(|| unknown_model(model))?;
        if entry.slot(version).is_none() {
            return Err(unknown_version(model, version));
        }
        if entry.resident(version).is_none() {
            return Err(RegistryError::conflict(format!(
                "{model}@{version} is not loaded; load it first (POST /admin/models/{model}/versions/{version}/load)"
            )));
        }
        let previous = entry.active.replace(version.to_owned());
        if let Some(previous) = &previous {
            if previous != version {
                entry.history.push(previous.clone());
            }
        }
        drop(models);
        self.observer.activated(model, version, previous.as_deref());
        tracing::info!(model, version, previous = ?previous, "activated");
        Ok(previous)
    }

    /// Makes the most recently active, still resident, earlier version
    /// active again. Returns `(from, to)`.
    pub fn rollback(&self, model: &str) -> Result<(String, String), RegistryError> {
        let mut models = self.write();
        let entry = models.get_mut(model).ok_or_else(|| unknown_model(model))?;
        let current = entry.active.clone().ok_or_else(|| {
            RegistryError::conflict(format!(
                "model `{model}` has no active version to roll back from"
            ))
        })?;
        while let Some(previous) = entry.history.pop() {
            if previous == current || entry.resident(&previous).is_none() {
                continue;
            }
            entry.active = Some(previous.clone());
            drop(models);
            self.observer.activated(model, &previous, Some(&current));
            tracing::info!(model, from = %current, to = %previous, "rolled back");
            return Ok((current, previous));
        }
        Err(RegistryError::conflict(format!(
            "model `{model}` has no earlier version still loaded to roll back to; load one and activate it"
        )))
    }

    /// Takes `model@version` out of RAM. Its requests in flight finish
    /// first (they hold the version); the active version cannot be unloaded.
    /// Returns how many requests are still draining from it.
    pub fn unload(&self, model: &str, version: &str) -> Result<usize, RegistryError> {
        let mut models = self.write();
        let entry = models.get_mut(model).ok_or_else(|| unknown_model(model))?;
        if entry.active.as_deref() == Some(version) {
            return Err(RegistryError::conflict(format!(
                "{model}@{version} is the active version; activate another version (or roll back) first"
            )));
        }
        let slot = entry
            .slot_mut(version)
            .ok_or_else(|| unknown_version(model, version))?;
        let draining = match &slot.state {
            State::Resident(handle) => handle.demand(),
            State::Loading => {
                return Err(RegistryError::conflict(format!(
                    "{model}@{version} is loading; unload it when the load finishes"
                )));
            }
            State::Disk => {
                return Err(RegistryError::conflict(format!(
                    "{model}@{version} is not loaded"
                )))
            }
        };
        slot.set_state(State::Disk);
        slot.evicted = false;
        drop(models);
        self.observer
            .unloaded(&CheckpointId::new(model, version), false);
        tracing::info!(model, version, draining, "unloaded");
        Ok(draining)
    }

    /// The checkpoint a request for `spec` runs on: `model` or an alias
    /// (its active version) or `model@version` (that version, resident).
    pub fn resolve(&self, spec: &str) -> Result<CheckpointHandle<B>, RegistryError> {
        self.resolve_spec(&ModelSpec::parse(spec))
    }

    /// [`Registry::resolve`] for a spec already parsed (a request's `model`).
    pub fn resolve_spec(&self, spec: &ModelSpec) -> Result<CheckpointHandle<B>, RegistryError> {
        let (name, version) = (spec.name(), spec.version());
        let models = self.read();
        let (model_name, model) = models
            .get_key_value(name)
            .or_else(|| {
                models
                    .iter()
                    .find(|(_, m)| m.aliases.iter().any(|a| a == name))
            })
            .ok_or_else(|| unknown_model(name))?;
        let version = match version {
            Some(version) => version,
            None => model.active.as_deref().ok_or_else(|| {
                RegistryError::conflict(format!(
                    "model `{model_name}` has no active version; activate one through the admin API"
                ))
            })?,
        };
        if model.slot(version).is_none() {
            return Err(unknown_version(model_name, version));
        }
        model.resident(version).cloned().ok_or_else(|| {
            RegistryError::conflict(format!(
                "{model_name}@{version} is not loaded; ask for `{model_name}` (its active version) \
                 or load this version through the admin API"
            ))
        })
    }

    /// The live routing state of `model@version`, to keep and read without
    /// the registry's lock; `None` if that version is not registered. It
    /// follows the version through loads, evictions and unloads.
    pub fn live(&self, model: &str, version: &str) -> Option<Arc<LiveSlot<B>>> {
        let models = self.read();
        let slot = models.get(model)?.slot(version)?;
        Some(Arc::clone(&slot.live))
    }

    /// What routing weighs for `model@version` (or the active version of
    /// `model`): its tier, its bytes, and the requests waiting for it; one
    /// lookup under one read lock, no allocation. `None` if unknown.
    pub fn routing_state(&self, model: &str, version: Option<&str>) -> Option<RoutingState> {
        let models = self.read();
        let entry = models.get(model)?;
        let version = version.or(entry.active.as_deref())?;
        Some(entry.slot(version)?.live.routing_state())
    }

    /// Every model with an active version: `(name, active handle)`.
    pub fn active(&self) -> Vec<CheckpointHandle<B>> {
        let models = self.read();
        models
            .values()
            .filter_map(|m| m.active.as_deref().and_then(|v| m.resident(v)).cloned())
            .collect()
    }

    /// Every model, version and its tier.
    pub fn status(&self) -> Vec<ModelStatus> {
        self.refresh_placements();
        let models = self.read();
        models
            .iter()
            .map(|(name, model)| ModelStatus {
                name: name.clone(),
                aliases: model.aliases.clone(),
                active_version: model.active.clone(),
                rollback_history: model.history.clone(),
                versions: model
                    .versions
                    .iter()
                    .map(|slot| version_status(model, slot))
                    .collect(),
            })
            .collect()
    }

    /// Bytes by tier.
    pub fn memory(&self) -> MemoryStatus {
        let mut memory = MemoryStatus {
            ram_bytes: self.device_bytes(),
            ram_budget_bytes: self.ram_budget,
            host_bytes: self.backend.host_tier_bytes(),
            ..MemoryStatus::default()
        };
        for model in self.status() {
            for version in model.versions {
                match version.tier {
                    Tier::Ram | Tier::Device => {
                        memory.resident_versions += 1;
                        memory.ram_bytes_without_sharing += version.bytes;
                    }
                    Tier::Host => memory.host_versions += 1,
                    Tier::Disk | Tier::Loading => {
                        memory.disk_versions += 1;
                        memory.disk_bytes += version.bytes;
                    }
                }
            }
        }
        memory
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Model<B>>> {
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Model<B>>> {
        self.models.write().unwrap_or_else(|p| p.into_inner())
    }
}

fn version_status<B: Backend>(model: &Model<B>, slot: &Slot<B>) -> VersionStatus {
    let active = model.active.as_deref() == Some(slot.version.as_str());
    let adapter = model.adapter_of(slot);
    let adapter_bytes = match &slot.state {
        State::Resident(h) => h.adapter.as_ref().map(|a| a.bytes()),
        _ => None,
    };
    let (tier, bytes, shared_bytes, in_flight, queued, load_ms) = match &slot.state {
        State::Resident(h) => (
            Tier::loaded::<B>(h.placement()),
            h.load_stats.total_bytes,
            h.load_stats.shared_bytes,
            h.demand(),
            h.queued(),
            Some(h.load_time.as_secs_f64() * 1e3),
        ),
        State::Loading | State::Disk => (slot.tier(), slot.disk_bytes, 0, 0, 0, None),
    };
    let (family, quant_mix) = match &slot.state {
        State::Resident(h) => (
            Some(h.model.config().architecture.name().to_string()),
            h.quant_mix.clone(),
        ),
        _ => (None, None),
    };
    VersionStatus {
        family,
        quant_mix,
        version: slot.version.clone(),
        path: slot.path.display().to_string(),
        tier,
        active,
        bytes,
        shared_bytes,
        in_flight,
        queued,
        load_ms,
        last_error: slot.last_error.clone(),
        parent: adapter.map(|a| a.parent.clone()),
        adapter: adapter.map(|a| a.path.display().to_string()),
        adapter_bytes,
        evicted: slot.evicted,
    }
}

/// Bytes of a checkpoint file, or of every file in a checkpoint folder.
fn file_bytes(path: &Path) -> u64 {
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn unknown_model(model: &str) -> RegistryError {
    RegistryError::not_found(format!(
        "no model named `{model}`; GET /v1/models lists the served models"
    ))
}

fn unknown_version(model: &str, version: &str) -> RegistryError {
    RegistryError::not_found(format!(
        "model `{model}` has no version `{version}`; GET /admin/models lists its versions"
    ))
}

/// `load()`, with a panic inside it turned into the load's error (naming the version,
/// the file and the panic's message), so that the caller's bookkeeping runs either way.
fn panic_as_error<T>(
    id: &CheckpointId,
    path: &Path,
    load: impl FnOnce() -> Result<T, RegistryError>,
) -> Result<T, RegistryError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)).unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        Err(RegistryError::invalid(format!(
            "loading {id} from {} panicked ({reason}); the file is unusable or this is a bug",
            path.display()
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_loading_is_the_loads_error() {
        let id = CheckpointId::new("m", "2");
        let path = Path::new("/models/m/2/model.gguf");
        let error = panic_as_error::<()>(&id, path, || panic!("index out of bounds: 7"))
            .expect_err("a panic is an error");
        assert!(error.message.contains("m@2"), "{}", error.message);
        assert!(
            error.message.contains("/models/m/2/model.gguf"),
            "{}",
            error.message
        );
        assert!(
            error.message.contains("index out of bounds: 7"),
            "{}",
            error.message
        );
        let formatted = panic_as_error::<()>(&id, path, || panic!("shape {}", 3));
        assert!(formatted.expect_err("an error").message.contains("shape 3"));
        // A load that returns passes through unchanged.
        assert_eq!(panic_as_error(&id, path, || Ok(5)).ok(), Some(5));
    }
}
