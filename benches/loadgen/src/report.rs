//! `loadgen report OUT`: OUT/results.json to SVG plots and OUT/report.md
//! (tables, the headline ratios, the plots).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::client::Record;
use crate::plot::{self, Chart, Series};
use crate::suite::{MultiRun, Results};

/// Writes the plots and report.md; returns the files written.
pub fn write(out: &Path) -> anyhow::Result<Vec<String>> {
    let path = out.join("results.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let results: Results = serde_json::from_str(&text)
        .with_context(|| format!("{} is not suite output", path.display()))?;
    let mut files = Vec::new();
    let mut md = String::new();
    writeln!(
        md,
        "# Multi-model serving: one engine, replicas, restarts\n"
    )?;
    writeln!(
        md,
        "Machine: {}. Every server process: {} kernel threads. Traffic: Poisson arrivals, \
         {} popularity over the checkpoints (most popular first: {}), {} s of arrivals per rate.\n",
        results.machine,
        results.threads,
        results.popularity,
        results
            .checkpoints
            .iter()
            .map(|c| c.split('=').next().unwrap_or(c))
            .collect::<Vec<_>>()
            .join(", "),
        results.seconds
    )?;

    let ks: BTreeSet<usize> = results.multi.iter().map(|r| r.k).collect();
    for &k in &ks {
        let runs: Vec<&MultiRun> = results.multi.iter().filter(|r| r.k == k).collect();
        let systems = ordered_systems(runs.iter().map(|r| r.system.as_str()));
        let by_system = |metric: &dyn Fn(&MultiRun) -> f64| -> Vec<Series> {
            systems
                .iter()
                .map(|s| {
                    let points = runs
                        .iter()
                        .filter(|r| &r.system == s)
                        .map(|r| (r.rate, metric(r)))
                        .collect();
                    (s.clone(), points)
                })
                .collect()
        };
        writeln!(md, "## K = {k}\n")?;
        let charts: [(String, Chart, Vec<Series>); 3] = [
            (
                format!("throughput_k{k}.svg"),
                Chart {
                    title: format!("K={k}: throughput"),
                    x_label: "offered load (requests/s)",
                    y_label: "generated tokens/s",
                    log_x: false,
                    log_y: false,
                },
                by_system(&|r| r.summary.tokens_per_second),
            ),
            (
                format!("ttft_p99_k{k}.svg"),
                Chart {
                    title: format!("K={k}: p99 time to first token"),
                    x_label: "offered load (requests/s)",
                    y_label: "ms (log)",
                    log_x: false,
                    log_y: true,
                },
                by_system(&|r| r.summary.ttft_ms[2]),
            ),
            (
                format!("latency_p99_k{k}.svg"),
                Chart {
                    title: format!("K={k}: p99 end-to-end latency"),
                    x_label: "offered load (requests/s)",
                    y_label: "ms (log)",
                    log_x: false,
                    log_y: true,
                },
                by_system(&|r| r.summary.e2e_ms[2]),
            ),
        ];
        for (file, chart, series) in &charts {
            plot::draw(&out.join(file), chart, series)?;
            files.push(file.clone());
        }
        let top_rate = runs.iter().map(|r| r.rate).fold(0.0, f64::max);
        let cdf_file = format!("latency_cdf_k{k}.svg");
        let cdf: Vec<Series> = systems
            .iter()
            .filter_map(|s| runs.iter().find(|r| &r.system == s && r.rate == top_rate))
            .map(|r| {
                Ok((
                    r.system.clone(),
                    cdf_points(&read_records(&out.join("runs").join(&r.records))?),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        plot::draw(
            &out.join(&cdf_file),
            &Chart {
                title: format!("K={k}: latency CDF at {top_rate} req/s"),
                x_label: "end-to-end latency, ms (log)",
                y_label: "fraction of requests",
                log_x: true,
                log_y: false,
            },
            &cdf,
        )?;
        files.push(cdf_file.clone());
        for (file, ..) in &charts {
            writeln!(md, "![{file}]({file})")?;
        }
        writeln!(md, "![{cdf_file}]({cdf_file})\n")?;
        writeln!(md, "| system | req/s offered | tok/s | TTFT p50 / p90 / p99 ms | latency p50 / p90 / p99 ms | failed | swaps (mean µs) |")?;
        writeln!(md, "| --- | --- | --- | --- | --- | --- | --- |")?;
        for r in &runs {
            let s = &r.summary;
            let swaps = match (r.swaps, r.swap_mean_us) {
                (Some(n), Some(us)) => format!("{n} ({us:.1})"),
                (Some(n), None) => n.to_string(),
                _ => "–".into(),
            };
            writeln!(
                md,
                "| {} | {} | {:.1} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {}/{} | {swaps} |",
                r.system, r.rate, s.tokens_per_second, s.ttft_ms[0], s.ttft_ms[1], s.ttft_ms[2],
                s.e2e_ms[0], s.e2e_ms[1], s.e2e_ms[2], s.failed, s.requests
            )?;
        }
        writeln!(md)?;
        headline(&mut md, &runs)?;
    }

    if !results.memory.is_empty() {
        let systems = ordered_systems(results.memory.iter().map(|m| m.system.as_str()));
        let series: Vec<Series> = systems
            .iter()
            .map(|s| {
                let points = results
                    .memory
                    .iter()
                    .filter(|m| &m.system == s)
                    .map(|m| (m.k as f64, mib(m.peak_rss_bytes)))
                    .collect();
                (s.clone(), points)
            })
            .collect();
        plot::draw(
            &out.join("memory.svg"),
            &Chart {
                title: "peak resident memory".into(),
                x_label: "checkpoints served (K)",
                y_label: "MiB (all processes)",
                log_x: false,
                log_y: false,
            },
            &series,
        )?;
        files.push("memory.svg".into());
        writeln!(md, "## Memory\n\n![memory.svg](memory.svg)\n")?;
        writeln!(
            md,
            "| K | system | peak RSS MiB | restarts (mean ms) |\n| --- | --- | --- | --- |"
        )?;
        for m in &results.memory {
            let restarts = match (m.restarts, m.restart_mean_ms) {
                (Some(n), Some(ms)) => format!("{n} ({ms:.0})"),
                (Some(n), None) => n.to_string(),
                _ => "–".into(),
            };
            writeln!(
                md,
                "| {} | {} | {:.0} | {restarts} |",
                m.k,
                m.system,
                mib(m.peak_rss_bytes)
            )?;
        }
        writeln!(md)?;
    }

    if !results.single.is_empty() {
        let systems = ordered_systems(results.single.iter().map(|r| r.system.as_str()));
        let series = |metric: &dyn Fn(&crate::suite::SingleRun) -> f64| -> Vec<Series> {
            systems
                .iter()
                .map(|s| {
                    (
                        s.clone(),
                        results
                            .single
                            .iter()
                            .filter(|r| &r.system == s)
                            .map(|r| (r.clients as f64, metric(r)))
                            .collect(),
                    )
                })
                .collect()
        };
        plot::draw(
            &out.join("single_throughput.svg"),
            &Chart {
                title: "one model: throughput".into(),
                x_label: "concurrent streaming clients (log)",
                y_label: "generated tokens/s",
                log_x: true,
                log_y: false,
            },
            &series(&|r| r.summary.tokens_per_second),
        )?;
        plot::draw(
            &out.join("single_latency_p99.svg"),
            &Chart {
                title: "one model: p99 end-to-end latency".into(),
                x_label: "concurrent streaming clients (log)",
                y_label: "ms (log)",
                log_x: true,
                log_y: true,
            },
            &series(&|r| r.summary.e2e_ms[2]),
        )?;
        files.extend([
            "single_throughput.svg".into(),
            "single_latency_p99.svg".into(),
        ]);
        writeln!(md, "## One model\n\n![single_throughput.svg](single_throughput.svg)\n![single_latency_p99.svg](single_latency_p99.svg)\n")?;
        writeln!(md, "| system | clients | tok/s | TTFT p50 / p99 ms | latency p50 / p90 / p99 ms | failed | peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- |")?;
        for r in &results.single {
            let s = &r.summary;
            writeln!(
                md,
                "| {} | {} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {}/{} | {:.0} |",
                r.system,
                r.clients,
                s.tokens_per_second,
                s.ttft_ms[0],
                s.ttft_ms[2],
                s.e2e_ms[0],
                s.e2e_ms[1],
                s.e2e_ms[2],
                s.failed,
                s.requests,
                mib(r.peak_rss_bytes)
            )?;
        }
        writeln!(md)?;
    }
    std::fs::write(out.join("report.md"), md)?;
    files.push("report.md".into());
    Ok(files)
}

/// The ratios at each rate: restart's p99 TTFT over the one
/// engine's, and the one engine's throughput over the replicas'.
fn headline(md: &mut String, runs: &[&MultiRun]) -> anyhow::Result<()> {
    let find = |system: &str, rate: f64| runs.iter().find(|r| r.system == system && r.rate == rate);
    let rates: Vec<f64> = runs
        .iter()
        .filter(|r| r.system == ONE_ENGINE)
        .map(|r| r.rate)
        .collect();
    if rates.is_empty() {
        return Ok(());
    }
    writeln!(md, "| req/s | p99 TTFT, restart ÷ one engine (switchyard; llama-server) | throughput, one engine ÷ replicas (switchyard; llama-server) |\n| --- | --- | --- |")?;
    for rate in rates {
        let Some(one) = find(ONE_ENGINE, rate) else {
            continue;
        };
        let ratio = |other: &str, f: &dyn Fn(&MultiRun) -> f64, inverse: bool| {
            find(other, rate).map_or("–".to_owned(), |o| {
                let (a, b) = if inverse {
                    (f(one), f(o))
                } else {
                    (f(o), f(one))
                };
                if b > 0.0 {
                    format!("{:.1}×", a / b)
                } else {
                    "∞".to_owned()
                }
            })
        };
        let ttft = |r: &MultiRun| r.summary.ttft_ms[2];
        let tput = |r: &MultiRun| r.summary.tokens_per_second;
        writeln!(
            md,
            "| {rate} | {}; {} | {}; {} |",
            ratio("switchyard restart on switch", &ttft, false),
            ratio("llama-server restart on switch", &ttft, false),
            ratio("switchyard replicas", &tput, true),
            ratio("llama-server replicas", &tput, true),
        )?;
    }
    writeln!(md)?;
    Ok(())
}

const ONE_ENGINE: &str = "switchyard one engine";

/// Systems in first-seen order, without repeats.
fn ordered_systems<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for name in names {
        if !seen.iter().any(|s| s == name) {
            seen.push(name.to_owned());
        }
    }
    seen
}

fn read_records(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .map(|l| {
            serde_json::from_str(l).with_context(|| format!("bad record in {}", path.display()))
        })
        .collect()
}

/// (latency, fraction at or below it) over successful requests, thinned to
/// at most 200 points.
fn cdf_points(records: &[Record]) -> Vec<(f64, f64)> {
    let mut latencies: Vec<f64> = records.iter().filter(|r| r.ok).map(|r| r.e2e_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len();
    let step = n.div_ceil(200).max(1);
    (0..n)
        .filter(|i| i % step == 0 || i + 1 == n)
        .map(|i| (latencies[i], (i + 1) as f64 / n as f64))
        .collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
