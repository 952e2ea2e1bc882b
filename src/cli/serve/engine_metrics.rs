//! The engine's Prometheus series: swaps, steps, queues, loads, residency
//! and active versions. Label values are checkpoint names the registry
//! knows (a bounded set), never raw request text.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use switchyard_engine::registry::{Registry, RegistryObserver};
use switchyard_engine::serving::{CheckpointId, ExecutorObserver, ScopeUsage};
use switchyard_kernels::Backend;
use switchyard_router::metrics::{set_queue_depth, STEP_ROWS, SWAP_DURATION_SECONDS};

/// Counter: weight-table swaps between checkpoints.
const SWAPS_TOTAL: &str = "switchyard_swaps_total";
/// Counter: forward steps that ran a checkpoint's rows, by `model` and
/// `version` (a step shared by checkpoints that share tensors counts for each).
const STEPS_TOTAL: &str = "switchyard_steps_total";
/// Histogram: wall seconds of each forward step, by `model` and `version`: its
/// `_sum` is the engine time a checkpoint's tokens took where they were made (the
/// cost `benches/cost_quality.py` prices a cascade by). A step shared by checkpoints
/// that share tensors counts whole for each, as in `switchyard_steps_total`.
const STEP_SECONDS: &str = "switchyard_step_seconds";
/// Gauge: requests waiting for a batch slot, by `model` and `version`.
const CHECKPOINT_QUEUE_DEPTH: &str = "switchyard_checkpoint_queue_depth";
/// Counter: checkpoint loads by `model`, `version` and `result`.
const LOADS_TOTAL: &str = "switchyard_loads_total";
/// Histogram: checkpoint load duration (read, store, smoke forward).
const LOAD_DURATION_SECONDS: &str = "switchyard_load_duration_seconds";
/// Counter: versions taken out of RAM, by `reason` (unload or evict).
const UNLOADS_TOTAL: &str = "switchyard_unloads_total";
/// Gauge: 1 for each model's active version, by `model` and `version`.
const ACTIVE_VERSION: &str = "switchyard_active_version";
/// Gauge: bytes by `tier` (ram: distinct resident tensor bytes, in device
/// memory on a GPU; host: matrices a GPU backend demoted to pinned host
/// memory; disk: known versions only on disk).
const RESIDENT_BYTES: &str = "switchyard_memory_bytes";

/// Counter: prompt tokens of admitted requests by `model`, `version` and
/// `result`: `hit` tokens came from the prompt cache, `miss` tokens were
/// computed (the cache's hits and misses, counted in tokens).
const PROMPT_CACHE_TOKENS_TOTAL: &str = "switchyard_prompt_cache_tokens_total";
/// Counter: cached prompt blocks (`--kv-block` positions each) evicted to make room
/// in the KV budget.
const PROMPT_CACHE_EVICTIONS_TOTAL: &str = "switchyard_prompt_cache_evictions_total";
/// Gauge: blocks the prompt cache holds.
const PROMPT_CACHE_BLOCKS: &str = "switchyard_prompt_cache_blocks";
/// Gauge: bytes of the KV budget the prompt cache's blocks take.
const PROMPT_CACHE_BYTES: &str = "switchyard_prompt_cache_bytes";

/// Gauge: blocks the prompt cache holds per `cache_scope` (`deployment`,
/// `tenant:<name>`, `shared:<name>`). Names tenants: admin metrics only.
const PROMPT_CACHE_SCOPE_BLOCKS: &str = "switchyard_prompt_cache_scope_blocks";
/// Gauge: bytes of the KV budget the prompt cache's blocks take per `cache_scope`.
const PROMPT_CACHE_SCOPE_BYTES: &str = "switchyard_prompt_cache_scope_bytes";

/// Counter: speculative draft tokens verified, by `model` and `version`.
const SPECULATIVE_DRAFT_TOKENS_TOTAL: &str = "switchyard_speculative_draft_tokens_total";
/// Counter: of those, the tokens kept (each saved a forward step).
const SPECULATIVE_ACCEPTED_TOKENS_TOTAL: &str = "switchyard_speculative_accepted_tokens_total";
/// Gauge: accepted over drafted tokens since the start, by `model` and `version`.
const SPECULATIVE_ACCEPTANCE_RATE: &str = "switchyard_speculative_acceptance_rate";

/// Reports the executor's events.
#[derive(Default)]
pub struct ExecutorMetrics {
    /// Scopes reported so far: one that no longer holds a block is set to 0.
    scopes: Mutex<BTreeSet<String>>,
    /// Drafted and accepted tokens per checkpoint, for the acceptance rate.
    speculation: Mutex<BTreeMap<CheckpointId, (u64, u64)>>,
}

impl ExecutorObserver for ExecutorMetrics {
    fn queue_depth(&self, checkpoint: &CheckpointId, depth: usize) {
        metrics::gauge!(
            CHECKPOINT_QUEUE_DEPTH,
            "model" => checkpoint.model.clone(),
            "version" => checkpoint.version.clone()
        )
        .set(depth as f64);
        set_queue_depth(&checkpoint.model, depth);
    }

    fn swap(&self, _from: Option<&CheckpointId>, _to: &CheckpointId, latency: Duration) {
        metrics::counter!(SWAPS_TOTAL).increment(1);
        metrics::histogram!(SWAP_DURATION_SECONDS).record(latency.as_secs_f64());
    }

    fn step(&self, checkpoint: &CheckpointId, rows: usize, _sequences: usize, elapsed: Duration) {
        let (model, version) = (checkpoint.model.clone(), checkpoint.version.clone());
        metrics::counter!(STEPS_TOTAL, "model" => model.clone(), "version" => version.clone())
            .increment(1);
        metrics::histogram!(STEP_SECONDS, "model" => model.clone(), "version" => version.clone())
            .record(elapsed.as_secs_f64());
        metrics::histogram!(STEP_ROWS, "model" => model, "version" => version).record(rows as f64);
    }

    fn speculation(&self, checkpoint: &CheckpointId, drafted: usize, accepted: usize) {
        let (model, version) = (checkpoint.model.clone(), checkpoint.version.clone());
        metrics::counter!(
            SPECULATIVE_DRAFT_TOKENS_TOTAL,
            "model" => model.clone(),
            "version" => version.clone()
        )
        .increment(drafted as u64);
        metrics::counter!(
            SPECULATIVE_ACCEPTED_TOKENS_TOTAL,
            "model" => model.clone(),
            "version" => version.clone()
        )
        .increment(accepted as u64);
        let mut totals = self
            .speculation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let total = totals.entry(checkpoint.clone()).or_default();
        total.0 += drafted as u64;
        total.1 += accepted as u64;
        if total.0 > 0 {
            metrics::gauge!(SPECULATIVE_ACCEPTANCE_RATE, "model" => model, "version" => version)
                .set(total.1 as f64 / total.0 as f64);
        }
    }

    fn prompt_cache(&self, checkpoint: &CheckpointId, cached: usize, computed: usize) {
        let (model, version) = (checkpoint.model.clone(), checkpoint.version.clone());
        metrics::counter!(
            PROMPT_CACHE_TOKENS_TOTAL,
            "model" => model.clone(),
            "version" => version.clone(),
            "result" => "hit"
        )
        .increment(cached as u64);
        metrics::counter!(
            PROMPT_CACHE_TOKENS_TOTAL,
            "model" => model,
            "version" => version,
            "result" => "miss"
        )
        .increment(computed as u64);
    }

    fn prompt_cache_evicted(&self, blocks: usize) {
        metrics::counter!(PROMPT_CACHE_EVICTIONS_TOTAL).increment(blocks as u64);
    }

    fn prompt_cache_size(&self, blocks: usize, bytes: usize) {
        // Exported from the first cached block on, zero until one is evicted.
        metrics::counter!(PROMPT_CACHE_EVICTIONS_TOTAL).increment(0);
        metrics::gauge!(PROMPT_CACHE_BLOCKS).set(blocks as f64);
        metrics::gauge!(PROMPT_CACHE_BYTES).set(bytes as f64);
    }

    fn prompt_cache_scopes(&self, scopes: &[ScopeUsage]) {
        let mut seen = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in seen
            .iter()
            .filter(|s| !scopes.iter().any(|u| &u.scope == *s))
        {
            metrics::gauge!(PROMPT_CACHE_SCOPE_BLOCKS, "cache_scope" => gone.clone()).set(0.0);
            metrics::gauge!(PROMPT_CACHE_SCOPE_BYTES, "cache_scope" => gone.clone()).set(0.0);
        }
        for usage in scopes {
            let scope = usage.scope.clone();
            metrics::gauge!(PROMPT_CACHE_SCOPE_BLOCKS, "cache_scope" => scope.clone())
                .set(usage.blocks as f64);
            metrics::gauge!(PROMPT_CACHE_SCOPE_BYTES, "cache_scope" => scope.clone())
                .set(usage.bytes as f64);
            seen.insert(scope);
        }
    }
}

/// Reports the registry's events and keeps the memory gauges current.
pub struct RegistryMetrics<B: Backend> {
    registry: std::sync::OnceLock<std::sync::Weak<Registry<B>>>,
}

impl<B: Backend> RegistryMetrics<B> {
    pub fn new() -> Arc<RegistryMetrics<B>> {
        Arc::new(RegistryMetrics {
            registry: std::sync::OnceLock::new(),
        })
    }

    /// Lets the observer read the registry's memory after each event.
    pub fn attach(&self, registry: &Arc<Registry<B>>) {
        let _ = self.registry.set(Arc::downgrade(registry));
        self.refresh_memory();
    }

    /// Sets the memory gauges from the registry.
    pub fn refresh_memory(&self) {
        let Some(registry) = self.registry.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        let memory = registry.memory();
        metrics::gauge!(RESIDENT_BYTES, "tier" => "ram").set(memory.ram_bytes as f64);
        metrics::gauge!(RESIDENT_BYTES, "tier" => "host").set(memory.host_bytes as f64);
        metrics::gauge!(RESIDENT_BYTES, "tier" => "disk").set(memory.disk_bytes as f64);
    }
}

impl<B: Backend> RegistryObserver for RegistryMetrics<B> {
    fn load(&self, id: &CheckpointId, elapsed: Duration, error: Option<&str>) {
        let result = if error.is_some() { "error" } else { "ok" };
        metrics::counter!(
            LOADS_TOTAL,
            "model" => id.model.clone(),
            "version" => id.version.clone(),
            "result" => result
        )
        .increment(1);
        if error.is_none() {
            metrics::histogram!(LOAD_DURATION_SECONDS).record(elapsed.as_secs_f64());
        }
        self.refresh_memory();
    }

    fn activated(&self, model: &str, version: &str, previous: Option<&str>) {
        if let Some(previous) = previous {
            metrics::gauge!(ACTIVE_VERSION, "model" => model.to_owned(), "version" => previous.to_owned())
                .set(0.0);
        }
        metrics::gauge!(ACTIVE_VERSION, "model" => model.to_owned(), "version" => version.to_owned())
            .set(1.0);
    }

    fn unloaded(&self, _id: &CheckpointId, evicted: bool) {
        let reason = if evicted { "evict" } else { "unload" };
        metrics::counter!(UNLOADS_TOTAL, "reason" => reason).increment(1);
        self.refresh_memory();
    }
}
