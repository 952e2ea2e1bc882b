//! The series an inference gateway's endpoint picker reads to place
//! requests on pods (the Gateway API Inference Extension's model-server
//! protocol): requests waiting and running, KV-cache use, and which
//! checkpoints are resident, under vLLM's names (so a stock picker
//! configuration works) and under Switchyard's own.
//!
//! They are computed from the executor and the registry when `/metrics` is
//! scraped, not recorded as events happen: the values then agree with the
//! engine's state at the scrape, and `vllm:lora_requests_info`, whose labels
//! change with residency, has exactly one current series (vLLM leaves every
//! past label set behind, and pickers take the one with the latest
//! timestamp as its value; one series valued "now" reads the same way).
//!
//! What the numbers mean here (docs/SCALE-OUT.md says the same for operators):
//! - waiting: requests submitted to the executor and not yet admitted to a
//!   sequence slot, over every checkpoint;
//! - running: sequences holding a slot (a KV cache), over every checkpoint;
//! - KV-cache use: KV bytes in use over the KV budget (`--kv-budget-mb`),
//!   the figure admission weighs a newcomer's cache against
//!   (`Executor::kv_bytes`: every block a running sequence may hold,
//!   reserved when it was admitted, and the cached prompt blocks sequences
//!   read; cached blocks nobody reads are evicted for room, so they count as
//!   free, as in vLLM). Near 1.0 a newcomer waits. The sequence slots
//!   (`--max-batch`) are a second limit, read from running / slots;
//! - resident checkpoints (`running_lora_adapters`): every `name@version` in
//!   RAM, ready to serve, as clients name it;
//! - `waiting_lora_adapters`: checkpoints being loaded, and those with
//!   requests waiting that are not resident: an adapter evicted by the
//!   adapter budget and asked for again reads as loading until it is back
//!   (its requests were told to retry, `registry/versions/reload.rs`), so the
//!   picker keeps sending them to the pod bringing it in;
//! - residency slots (`max_lora`): the checkpoints this pod can hold in RAM
//!   at once: every registered version without `--ram-budget-mb`; with one,
//!   the resident versions plus the on-disk versions that fit the room left,
//!   smallest first, each counted at its file size (an upper bound: tensors
//!   it shares with resident checkpoints are stored once).

use std::fmt::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_engine::registry::{MemoryStatus, ModelStatus, Tier};
use switchyard_router::metrics::ScrapeSource;

use switchyard_engine::Engine;
use switchyard_kernels::Backend;

/// One scrape's view of the engine, read at once.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSnapshot {
    pub waiting: usize,
    pub running: usize,
    pub kv_slots: usize,
    pub kv_tokens: usize,
    /// KV bytes in use, and the budget they are reserved from.
    pub kv_bytes: usize,
    pub kv_budget_bytes: usize,
    /// Resident checkpoints as `name@version`, in the registry's order.
    pub resident: Vec<(String, String)>,
    /// Checkpoints with requests waiting that are not resident.
    pub waiting_checkpoints: Vec<(String, String)>,
    pub residency_slots: usize,
    /// Unix seconds when the snapshot was taken.
    pub timestamp: f64,
}

impl PoolSnapshot {
    /// The snapshot from the registry's `models` and `memory` and the
    /// executor's counters.
    pub fn new(
        models: &[ModelStatus],
        memory: &MemoryStatus,
        executor: ExecutorCounts,
        timestamp: f64,
    ) -> PoolSnapshot {
        let mut resident = Vec::new();
        let mut waiting_checkpoints = Vec::new();
        for model in models {
            for version in &model.versions {
                let id = (model.name.clone(), version.version.clone());
                if version.tier.is_resident() {
                    resident.push(id);
                } else if version.queued > 0 || version.tier == Tier::Loading {
                    waiting_checkpoints.push(id);
                }
            }
        }
        PoolSnapshot {
            waiting: executor.waiting,
            running: executor.running,
            kv_slots: executor.kv_slots.max(1),
            kv_tokens: executor.kv_tokens,
            kv_bytes: executor.kv_bytes,
            kv_budget_bytes: executor.kv_budget_bytes,
            resident,
            waiting_checkpoints,
            residency_slots: residency_slots(models, memory),
            timestamp,
        }
    }

    /// KV bytes in use over the KV budget, in [0, 1].
    pub fn kv_usage(&self) -> f64 {
        (self.kv_bytes as f64 / self.kv_budget_bytes.max(1) as f64).min(1.0)
    }

    /// The Prometheus text of every pool family.
    pub fn render(&self, out: &mut String) {
        let waiting = self.waiting as f64;
        let running = self.running as f64;
        let usage = self.kv_usage();
        gauge(
            out,
            "switchyard_requests_waiting",
            "Requests waiting for a sequence slot, over every checkpoint",
            waiting,
        );
        gauge(
            out,
            "switchyard_requests_running",
            "Sequences holding a slot (a KV cache), over every checkpoint",
            running,
        );
        gauge(
            out,
            "switchyard_kv_cache_usage_ratio",
            "KV bytes in use over the KV budget (--kv-budget-mb); near 1 new requests wait",
            usage,
        );
        gauge(
            out,
            "switchyard_kv_cache_bytes",
            "KV bytes in use: what running sequences reserve and the cached prompt blocks they read",
            self.kv_bytes as f64,
        );
        gauge(
            out,
            "switchyard_kv_cache_budget_bytes",
            "The KV budget sequences and cached prompt blocks reserve from (--kv-budget-mb)",
            self.kv_budget_bytes as f64,
        );
        gauge(
            out,
            "switchyard_kv_cache_slots",
            "Sequence slots, each holding one KV cache (--max-batch)",
            self.kv_slots as f64,
        );
        gauge(
            out,
            "switchyard_kv_cache_tokens",
            "Token positions written in the running sequences' KV caches",
            self.kv_tokens as f64,
        );
        gauge(
            out,
            "switchyard_residency_slots",
            "Checkpoints this server can hold in RAM at once",
            self.residency_slots as f64,
        );
        family(
            out,
            "switchyard_checkpoint_resident",
            "1 for each checkpoint in RAM, ready to serve",
        );
        for (model, version) in &self.resident {
            let _ = writeln!(
                out,
                "switchyard_checkpoint_resident{{model=\"{}\",version=\"{}\"}} 1",
                escape(model),
                escape(version)
            );
        }

        // vLLM's names and meanings, as the endpoint picker reads them.
        gauge(
            out,
            "vllm:num_requests_waiting",
            "Requests waiting (switchyard_requests_waiting)",
            waiting,
        );
        gauge(
            out,
            "vllm:num_requests_running",
            "Requests running (switchyard_requests_running)",
            running,
        );
        gauge(
            out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage, 1 means full (switchyard_kv_cache_usage_ratio)",
            usage,
        );
        // The older name, which earlier endpoint pickers read; vLLM exports
        // both (this one deprecated).
        gauge(
            out,
            "vllm:gpu_cache_usage_perc",
            "KV-cache usage, 1 means full (switchyard_kv_cache_usage_ratio)",
            usage,
        );
        family(out, "vllm:lora_requests_info",
            "Resident checkpoints as running adapters; the value is when it was read (Unix seconds)");
        let _ = writeln!(
            out,
            "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
            self.residency_slots,
            escape(&joined(&self.resident)),
            escape(&joined(&self.waiting_checkpoints)),
            self.timestamp
        );
    }
}

/// The executor's counters a snapshot needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorCounts {
    pub waiting: usize,
    pub running: usize,
    pub kv_slots: usize,
    pub kv_tokens: usize,
    pub kv_bytes: usize,
    pub kv_budget_bytes: usize,
}

/// How many checkpoints fit in RAM at once (see the module's comment).
fn residency_slots(models: &[ModelStatus], memory: &MemoryStatus) -> usize {
    let versions = models.iter().flat_map(|m| &m.versions);
    let Some(budget) = memory.ram_budget_bytes else {
        return versions.count();
    };
    // A version being read in takes its room already.
    let held = versions.clone().filter(|v| v.tier != Tier::Disk).count();
    let mut on_disk: Vec<u64> = versions
        .filter(|v| v.tier == Tier::Disk)
        .map(|v| v.bytes)
        .collect();
    on_disk.sort_unstable();
    let mut room = budget.saturating_sub(memory.ram_bytes);
    let mut fit = 0;
    for bytes in on_disk {
        if bytes > room {
            break;
        }
        room -= bytes;
        fit += 1;
    }
    held + fit
}

fn joined(ids: &[(String, String)]) -> String {
    ids.iter()
        .map(|(model, version)| format!("{model}@{version}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    family(out, name, help);
    let _ = writeln!(out, "{name} {value}");
}

/// A label value as the text format writes it: backslash, quote and
/// newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The scrape source over the serving engine.
pub struct PoolMetrics<B: Backend> {
    engine: Arc<Engine<B>>,
}

impl<B: Backend> PoolMetrics<B> {
    pub fn new(engine: Arc<Engine<B>>) -> PoolMetrics<B> {
        PoolMetrics { engine }
    }

    fn snapshot(&self) -> PoolSnapshot {
        let executor = self.engine.executor();
        let counts = ExecutorCounts {
            waiting: executor.queue_depth(),
            running: executor.active_sequences(),
            kv_slots: executor.kv_slots(),
            kv_tokens: executor.kv_tokens(),
            kv_bytes: executor.kv_bytes(),
            kv_budget_bytes: executor.kv_pool().budget_bytes(),
        };
        let registry = self.engine.registry();
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        PoolSnapshot::new(&registry.status(), &registry.memory(), counts, timestamp)
    }
}

impl<B: Backend> ScrapeSource for PoolMetrics<B> {
    fn render(&self, out: &mut String) {
        self.snapshot().render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_engine::registry::VersionStatus;

    fn version(version: &str, tier: Tier, bytes: u64, queued: usize) -> VersionStatus {
        VersionStatus {
            version: version.into(),
            path: format!("/repo/m/{version}"),
            tier,
            active: false,
            bytes,
            shared_bytes: 0,
            in_flight: queued,
            queued,
            load_ms: None,
            last_error: None,
            family: None,
            quant_mix: None,
            parent: None,
            adapter: None,
            adapter_bytes: None,
            evicted: false,
        }
    }

    fn model(name: &str, versions: Vec<VersionStatus>) -> ModelStatus {
        ModelStatus {
            name: name.into(),
            aliases: Vec::new(),
            active_version: Some("1".into()),
            rollback_history: Vec::new(),
            versions,
        }
    }

    fn models() -> Vec<ModelStatus> {
        vec![
            model(
                "smollm2",
                vec![
                    version("1", Tier::Ram, 100, 2),
                    version("2", Tier::Disk, 90, 0),
                    version("3", Tier::Disk, 40, 0),
                ],
            ),
            model("say \"hi\"", vec![version("1", Tier::Ram, 50, 0)]),
        ]
    }

    fn counts() -> ExecutorCounts {
        ExecutorCounts {
            waiting: 3,
            running: 2,
            kv_slots: 8,
            kv_tokens: 77,
            kv_bytes: 2_500,
            kv_budget_bytes: 10_000,
        }
    }

    #[test]
    fn residency_slots_count_every_version_without_a_budget() {
        let memory = MemoryStatus::default();
        assert_eq!(residency_slots(&models(), &memory), 4);
    }

    #[test]
    fn residency_slots_add_what_fits_the_room_left_smallest_first() {
        let budget = |bytes| MemoryStatus {
            ram_bytes: 150,
            ram_budget_bytes: Some(bytes),
            ..MemoryStatus::default()
        };
        // Room 0: the two resident ones.
        assert_eq!(residency_slots(&models(), &budget(150)), 2);
        // Room 60: the 40-byte version fits, the 90-byte one then does not.
        assert_eq!(residency_slots(&models(), &budget(210)), 3);
        assert_eq!(residency_slots(&models(), &budget(280)), 4);
        // Over budget already (shared tensors, a budget lowered): no room.
        assert_eq!(residency_slots(&models(), &budget(100)), 2);
    }

    #[test]
    fn renders_vllm_and_switchyard_names_with_the_same_values() {
        let snapshot = PoolSnapshot::new(&models(), &MemoryStatus::default(), counts(), 1.5e9);
        let mut text = String::new();
        snapshot.render(&mut text);
        for line in [
            "vllm:num_requests_waiting 3",
            "switchyard_requests_waiting 3",
            "vllm:num_requests_running 2",
            "switchyard_requests_running 2",
            "vllm:kv_cache_usage_perc 0.25",
            "vllm:gpu_cache_usage_perc 0.25",
            "switchyard_kv_cache_usage_ratio 0.25",
            "switchyard_kv_cache_slots 8",
            "switchyard_kv_cache_tokens 77",
            "switchyard_kv_cache_bytes 2500",
            "switchyard_kv_cache_budget_bytes 10000",
            "switchyard_residency_slots 4",
            "switchyard_checkpoint_resident{model=\"smollm2\",version=\"1\"} 1",
            "switchyard_checkpoint_resident{model=\"say \\\"hi\\\"\",version=\"1\"} 1",
            "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"smollm2@1,say \\\"hi\\\"@1\",waiting_lora_adapters=\"\"} 1500000000",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        // Every family is declared once, with its type, before its samples.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(types.len(), unique.len());
        assert_eq!(types.len(), 14);
    }

    #[test]
    fn kv_usage_is_bytes_in_use_over_the_budget() {
        let usage =
            |counts| PoolSnapshot::new(&models(), &MemoryStatus::default(), counts, 0.0).kv_usage();
        let mut counts = counts();
        // Two of eight slots run, but they reserve 9/10 of the budget: a newcomer
        // needing more than the rest waits, and the gauge says so.
        counts.kv_bytes = 9_000;
        assert_eq!(usage(counts), 0.9);
        counts.kv_bytes = 10_000;
        assert_eq!(usage(counts), 1.0);
        counts.kv_bytes = 0;
        counts.kv_budget_bytes = 0;
        assert_eq!(usage(counts), 0.0);
    }

    #[test]
    fn a_checkpoint_being_loaded_is_a_waiting_adapter() {
        let mut models = models();
        models[0].versions[2].tier = Tier::Loading;
        let snapshot = PoolSnapshot::new(&models, &MemoryStatus::default(), counts(), 0.0);
        assert_eq!(
            snapshot.waiting_checkpoints,
            vec![("smollm2".into(), "3".into())]
        );
        assert!(!snapshot.resident.contains(&("smollm2".into(), "3".into())));
    }

    #[test]
    fn queued_requests_for_a_checkpoint_not_in_ram_are_waiting_adapters() {
        let mut models = models();
        models[0].versions[1].queued = 1;
        let snapshot = PoolSnapshot::new(&models, &MemoryStatus::default(), counts(), 0.0);
        assert_eq!(
            snapshot.waiting_checkpoints,
            vec![("smollm2".into(), "2".into())]
        );
        let mut text = String::new();
        snapshot.render(&mut text);
        assert!(
            text.contains("waiting_lora_adapters=\"smollm2@2\""),
            "{text}"
        );
    }
}
