//! The LoRA adapters' series, read from the registry at each scrape:
//! their bytes against the budget (`--lora-budget-mb`), evictions, and
//! `switchyard_lora_requests_info`, vLLM's `vllm:lora_requests_info` with
//! vLLM's meaning: the adapters with requests running and those with
//! requests waiting (queued for a slot, or for the adapter itself while it
//! is loaded again after an eviction), nothing else. (`vllm:lora_requests_info` itself lists
//! every resident checkpoint, adapters and bases, for the endpoint picker's
//! residency affinity; see `pool_metrics.rs`.)

use std::fmt::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_engine::registry::AdapterUsage;
use switchyard_engine::Engine;
use switchyard_kernels::Backend;
use switchyard_router::metrics::ScrapeSource;

/// The Prometheus text of the adapter families, for `usage` read at `timestamp`.
pub fn render(usage: &AdapterUsage, timestamp: f64, out: &mut String) {
    let resident: Vec<_> = usage.adapters.iter().filter(|a| a.resident).collect();
    if let Some(budget) = usage.budget_bytes {
        gauge(
            out,
            "switchyard_lora_budget_bytes",
            "Bytes resident LoRA adapters may hold (--lora-budget-mb)",
            budget as f64,
        );
    }
    gauge(
        out,
        "switchyard_lora_resident_bytes",
        "Bytes the resident LoRA adapters hold (their A and B matrices)",
        usage.resident_bytes as f64,
    );
    gauge(
        out,
        "switchyard_lora_resident_adapters",
        "LoRA adapter versions resident, ready to serve",
        resident.len() as f64,
    );
    let _ = writeln!(
        out,
        "# HELP switchyard_lora_evictions_total LoRA adapters evicted (least recently used, \
         idle) to fit the adapter budget"
    );
    let _ = writeln!(out, "# TYPE switchyard_lora_evictions_total counter");
    let _ = writeln!(out, "switchyard_lora_evictions_total {}", usage.evictions);

    let ids = |pick: &dyn Fn(&&switchyard_engine::registry::AdapterStatus) -> bool| {
        usage
            .adapters
            .iter()
            .filter(|a| pick(a))
            .map(|a| escape(&format!("{}@{}", a.name, a.version)))
            .collect::<Vec<_>>()
            .join(",")
    };
    let running = ids(&|a| a.running > 0);
    let waiting = ids(&|a| a.waiting > 0 || a.loading);
    let _ = writeln!(
        out,
        "# HELP switchyard_lora_requests_info LoRA adapters with requests running and waiting \
         (vLLM's lora_requests_info); the value is when it was read (Unix seconds)"
    );
    let _ = writeln!(out, "# TYPE switchyard_lora_requests_info gauge");
    let _ = writeln!(
        out,
        "switchyard_lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{running}\",\
         waiting_lora_adapters=\"{waiting}\"}} {timestamp}",
        max_lora(usage)
    );
}

/// How many adapters fit at once: every registered one without a budget;
/// with one, the budget over the mean resident adapter's bytes (at least
/// the adapters resident now).
fn max_lora(usage: &AdapterUsage) -> usize {
    let resident: Vec<u64> = (usage.adapters.iter())
        .filter(|a| a.resident)
        .map(|a| a.bytes)
        .collect();
    match usage.budget_bytes {
        None => usage.adapters.len(),
        Some(budget) => {
            let total: u64 = resident.iter().sum();
            if total == 0 {
                return usage.adapters.len();
            }
            let mean = total / resident.len() as u64;
            usize::try_from(budget / mean.max(1))
                .unwrap_or(usize::MAX)
                .max(resident.len())
        }
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The scrape source over the serving engine's registry.
pub struct LoraMetrics<B: Backend> {
    engine: Arc<Engine<B>>,
}

impl<B: Backend> LoraMetrics<B> {
    pub fn new(engine: Arc<Engine<B>>) -> LoraMetrics<B> {
        LoraMetrics { engine }
    }
}

impl<B: Backend> ScrapeSource for LoraMetrics<B> {
    fn render(&self, out: &mut String) {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        render(&self.engine.registry().adapter_usage(), timestamp, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_engine::registry::AdapterStatus;

    fn adapter(
        name: &str,
        resident: bool,
        bytes: u64,
        running: usize,
        waiting: usize,
        loading: bool,
    ) -> AdapterStatus {
        AdapterStatus {
            name: name.into(),
            version: "1".into(),
            parent: "smol".into(),
            path: format!("/a/{name}"),
            active: true,
            resident,
            bytes,
            running,
            waiting,
            loading,
            idle_ms: 0,
        }
    }

    #[test]
    fn only_adapters_with_requests_are_listed_running_or_waiting() {
        let usage = AdapterUsage {
            budget_bytes: Some(300),
            resident_bytes: 300,
            evictions: 3,
            adapters: vec![
                adapter("busy", true, 100, 2, 0, false),
                adapter("idle", true, 100, 0, 0, false),
                adapter("queued", true, 100, 0, 1, false),
                adapter("evicted", false, 0, 0, 0, false),
                adapter("reloading", false, 0, 0, 0, true),
            ],
        };
        let mut out = String::new();
        render(&usage, 12.5, &mut out);
        assert!(
            out.contains(
                "switchyard_lora_requests_info{max_lora=\"3\",running_lora_adapters=\"busy@1\",\
                 waiting_lora_adapters=\"queued@1,reloading@1\"} 12.5"
            ),
            "{out}"
        );
        assert!(out.contains("switchyard_lora_budget_bytes 300\n"), "{out}");
        assert!(
            out.contains("switchyard_lora_resident_bytes 300\n"),
            "{out}"
        );
        assert!(
            out.contains("switchyard_lora_resident_adapters 3\n"),
            "{out}"
        );
        assert!(out.contains("switchyard_lora_evictions_total 3\n"), "{out}");
    }
}
