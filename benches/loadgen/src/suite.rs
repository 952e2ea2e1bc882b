//! `loadgen suite`: every system on the same schedules in one run, written
//! to OUT/results.json (figures) and OUT/runs/*.jsonl (one record per
//! request), then the report (see `report`).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU16;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::client::{self, Mode};
use crate::stats::{self, Summary};
use crate::systems::{self, Engine, Layout, Settings};
use crate::workload::{self, Popularity};

#[derive(clap::Args, Debug)]
pub struct SuiteArgs {
    /// Where results.json, runs/, logs/ and the report go.
    #[arg(long)]
    pub out: PathBuf,
    /// The `switchyard` binary.
    #[arg(long)]
    pub switchyard: PathBuf,
    /// Arguments before the serve flags [default: serve]; `fake-server`
    /// with `--switchyard` pointing at loadgen itself for the harness test.
    #[arg(long, default_value = "serve")]
    pub switchyard_command: String,
    /// llama.cpp's `llama-server`; its rows are left out without it.
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// NAME=PATH of a checkpoint, most popular first; K takes the first K.
    #[arg(long = "checkpoint", required = true)]
    pub checkpoints: Vec<String>,
    /// Numbers of checkpoints served.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub k: Vec<usize>,
    /// Offered loads (requests/s, Poisson arrivals).
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    pub rates: Vec<f64>,
    /// Seconds of arrivals per rate.
    #[arg(long, default_value_t = 40.0)]
    pub seconds: f64,
    #[arg(long, default_value = "zipf:1")]
    pub popularity: Popularity,
    /// Concurrent clients for the one-model comparison (empty: skip it).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Seconds per client level.
    #[arg(long, default_value_t = 20.0)]
    pub client_seconds: f64,
    /// Kernel threads of every server process.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    #[arg(long, default_value_t = 19)]
    pub seed: u64,
    /// The first port servers get.
    #[arg(long, default_value_t = 18900)]
    pub base_port: u16,
    /// Leave the restart-on-switch systems out.
    #[arg(long)]
    pub no_restart: bool,
}

/// Everything the report is drawn from.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub machine: String,
    pub threads: usize,
    pub popularity: String,
    pub seconds: f64,
    pub checkpoints: Vec<String>,
    pub multi: Vec<MultiRun>,
    pub memory: Vec<Memory>,
    pub single: Vec<SingleRun>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MultiRun {
    pub k: usize,
    pub system: String,
    pub rate: f64,
    pub summary: Summary,
    /// The one engine's weight-table swaps during the run, and their mean.
    pub swaps: Option<u64>,
    pub swap_mean_us: Option<f64>,
    /// File under OUT/runs.
    pub records: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Memory {
    pub k: usize,
    pub system: String,
    pub peak_rss_bytes: u64,
    pub restarts: Option<u64>,
    pub restart_mean_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SingleRun {
    pub system: String,
    pub clients: usize,
    pub summary: Summary,
    pub peak_rss_bytes: u64,
    pub records: String,
}

pub async fn run(args: SuiteArgs) -> anyhow::Result<Results> {
    let checkpoints = args
        .checkpoints
        .iter()
        .map(|c| {
            let (name, path) = c
                .split_once('=')
                .with_context(|| format!("--checkpoint `{c}`: expected NAME=PATH"))?;
            Ok((name.to_owned(), PathBuf::from(path)))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for dir in ["runs", "logs"] {
        std::fs::create_dir_all(args.out.join(dir))?;
    }
    let settings = Settings {
        threads: args.threads,
        llama_slots: 64,
        logs: args.out.join("logs"),
        next_port: AtomicU16::new(args.base_port),
    };
    let mut engines = vec![Engine::Switchyard {
        program: args.switchyard.clone(),
        prefix: args
            .switchyard_command
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    }];
    if let Some(program) = &args.llama_server {
        engines.push(Engine::LlamaServer {
            program: program.clone(),
        });
    }
    let mut results = Results {
        machine: machine(),
        threads: args.threads,
        popularity: format!("{:?}", args.popularity),
        seconds: args.seconds,
        checkpoints: args.checkpoints.clone(),
        ..Results::default()
    };

    for &k in &args.k {
        anyhow::ensure!(
            k >= 1 && k <= checkpoints.len(),
            "K = {k}: only {} checkpoints",
            checkpoints.len()
        );
        let models = &checkpoints[..k];
        let names: Vec<String> = models.iter().map(|m| m.0.clone()).collect();
        for engine in &engines {
            for layout in [Layout::OneEngine, Layout::Replicas, Layout::Restart] {
                let one_engine_peer =
                    matches!(engine, Engine::LlamaServer { .. }) && layout == Layout::OneEngine;
                if one_engine_peer || (args.no_restart && layout == Layout::Restart) {
                    continue;
                }
                let system = format!("{} {}", engine.label(), layout.label());
                eprintln!("suite: K={k} {system}: starting");
                let running = systems::start(engine, layout, models, &settings)
                    .await
                    .with_context(|| format!("K={k} {system}"))?;
                for (i, &rate) in args.rates.iter().enumerate() {
                    // The same schedule for every system at this K and rate.
                    let count = ((rate * args.seconds).ceil() as usize).max(1);
                    let plan = workload::schedule(
                        args.seed + 1000 * k as u64 + i as u64,
                        &names,
                        args.popularity,
                        Some(rate),
                        count,
                    );
                    let before = scrape(running.metrics_url.as_deref()).await;
                    let records = client::run(&running.url, plan, Mode::Open).await;
                    let after = scrape(running.metrics_url.as_deref()).await;
                    let summary = stats::summarize(&records);
                    eprintln!(
                        "suite: K={k} {system} {rate} req/s: {:.1} tok/s, TTFT p99 {:.0} ms, {} failed",
                        summary.tokens_per_second, summary.ttft_ms[2], summary.failed
                    );
                    let file = format!("k{k}-{}-{rate}.jsonl", system.replace(' ', "-"));
                    write_records(&args.out.join("runs").join(&file), &records)?;
                    let (swaps, swap_mean_us) = match (before, after) {
                        (Some(b), Some(a)) => {
                            let n = a.swaps.saturating_sub(b.swaps);
                            let mean = (a.swap_count > b.swap_count).then(|| {
                                (a.swap_seconds - b.swap_seconds)
                                    / (a.swap_count - b.swap_count) as f64
                                    * 1e6
                            });
                            (Some(n), mean)
                        }
                        _ => (None, None),
                    };
                    results.multi.push(MultiRun {
                        k,
                        system: system.clone(),
                        rate,
                        summary,
                        swaps,
                        swap_mean_us,
                        records: file,
                    });
                    save(&args.out, &results)?;
                }
                let stopped = running.stop().await;
                results.memory.push(Memory {
                    k,
                    system,
                    peak_rss_bytes: stopped.peak_rss,
                    restarts: stopped.restarts.as_ref().map(|r| r.restarts),
                    restart_mean_ms: stopped.restarts.as_ref().and_then(|r| {
                        (!r.restart_ms.is_empty())
                            .then(|| r.restart_ms.iter().sum::<f64>() / r.restart_ms.len() as f64)
                    }),
                });
                save(&args.out, &results)?;
            }
        }
    }

    if !args.clients.is_empty() {
        let model = &checkpoints[..1];
        let names = vec![model[0].0.clone()];
        for engine in &engines {
            let system = engine.label().to_owned();
            for &clients in &args.clients {
                // A fresh process per level, so that peak memory is the level's.
                let running = systems::start(engine, Layout::OneEngine, model, &settings)
                    .await
                    .with_context(|| format!("one model, {system}"))?;
                let count = clients * (args.client_seconds as usize + 1) * 64;
                let plan = workload::schedule(args.seed, &names, Popularity::Uniform, None, count);
                let records = client::run(
                    &running.url,
                    plan,
                    Mode::Closed {
                        clients,
                        seconds: args.client_seconds,
                    },
                )
                .await;
                let stopped = running.stop().await;
                let summary = stats::summarize(&records);
                eprintln!(
                    "suite: one model, {system}, {clients} clients: {:.1} tok/s, p99 {:.0} ms, {} failed",
                    summary.tokens_per_second, summary.e2e_ms[2], summary.failed
                );
                let file = format!("single-{system}-{clients}.jsonl");
                write_records(&args.out.join("runs").join(&file), &records)?;
                results.single.push(SingleRun {
                    system: system.clone(),
                    clients,
                    summary,
                    peak_rss_bytes: stopped.peak_rss,
                    records: file,
                });
                save(&args.out, &results)?;
            }
        }
    }
    Ok(results)
}

fn write_records(path: &Path, records: &[client::Record]) -> anyhow::Result<()> {
    let mut text = String::new();
    for record in records {
        text.push_str(&serde_json::to_string(record)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

pub fn save(out: &Path, results: &Results) -> anyhow::Result<()> {
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The machine, for the report's header: CPU model and count, memory.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / (1024.0 * 1024.0));
    format!("{cpu}, {cores} cores, {memory_gib:.0} GiB")
}

/// The swap series of Switchyard's `/metrics`.
struct SwapCounters {
    swaps: u64,
    swap_seconds: f64,
    swap_count: u64,
}

async fn scrape(url: Option<&str>) -> Option<SwapCounters> {
    let text = reqwest::get(format!("{}/metrics", url?))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(parse_swaps(&text))
}

fn parse_swaps(text: &str) -> SwapCounters {
    let value = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                (key == name).then(|| value.parse::<f64>().ok()).flatten()
            })
            .unwrap_or(0.0)
    };
    SwapCounters {
        swaps: value("switchyard_swaps_total") as u64,
        swap_seconds: value("switchyard_swap_duration_seconds_sum"),
        swap_count: value("switchyard_swap_duration_seconds_count") as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_series_parse_from_prometheus_text() {
        let text = "# TYPE switchyard_swaps_total counter\nswitchyard_swaps_total 12\n\
                    switchyard_swap_duration_seconds{quantile=\"0.5\"} 0.000001\n\
                    switchyard_swap_duration_seconds_sum 0.000024\n\
                    switchyard_swap_duration_seconds_count 12\n";
        let c = parse_swaps(text);
        assert_eq!((c.swaps, c.swap_count), (12, 12));
        assert!((c.swap_seconds - 0.000024).abs() < 1e-12);
        assert_eq!(parse_swaps("").swaps, 0);
    }
}
