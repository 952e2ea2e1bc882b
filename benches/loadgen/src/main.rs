//! `loadgen`: the multi-model benchmark of issue 19 — a load generator
//! (open-loop Poisson or closed-loop clients, uniform or Zipf popularity,
//! streaming OpenAI requests), the systems it compares (Switchyard's one
//! engine, replicas behind a by-model proxy, restart on switch), and the
//! report (SVG plots, Markdown tables). See BENCHMARKS.md for the commands.

mod client;
mod fake_server;
mod plot;
mod process;
mod proxy;
mod report;
mod stats;
mod suite;
mod systems;
mod workload;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Multi-model serving benchmark: load, systems, report"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send one schedule to a running server and write one JSON record per request.
    Run(RunArgs),
    /// Start every system in turn, send each the same schedules, write OUT/results.json and the report.
    Suite(suite::SuiteArgs),
    /// Draw the plots and OUT/report.md from OUT/results.json.
    Report { out: PathBuf },
    /// A model-less stand-in for `switchyard serve` (the harness's own test).
    FakeServer(fake_server::FakeServerArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Model names, most popular first.
    #[arg(long, value_delimiter = ',', required = true)]
    models: Vec<String>,
    #[arg(long, default_value = "uniform")]
    popularity: workload::Popularity,
    /// Open loop: Poisson arrivals at this many requests/s.
    #[arg(long, conflicts_with = "clients")]
    rate: Option<f64>,
    /// Closed loop: this many clients back to back.
    #[arg(long)]
    clients: Option<usize>,
    /// Seconds of arrivals (open loop) or of sending (closed loop).
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    #[arg(long, default_value_t = 19)]
    seed: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => {
            let (mode, count, rate) = match (args.rate, args.clients) {
                (Some(rate), _) => (
                    client::Mode::Open,
                    ((rate * args.seconds).ceil() as usize).max(1),
                    Some(rate),
                ),
                (None, Some(clients)) => (
                    client::Mode::Closed {
                        clients,
                        seconds: args.seconds,
                    },
                    clients * (args.seconds as usize + 1) * 64,
                    None,
                ),
                (None, None) => anyhow::bail!("give --rate (open loop) or --clients (closed loop)"),
            };
            let plan = workload::schedule(args.seed, &args.models, args.popularity, rate, count);
            let records = client::run(&args.url, plan, mode).await;
            for record in &records {
                println!("{}", serde_json::to_string(record)?);
            }
            let s = stats::summarize(&records);
            eprintln!(
                "{} requests, {} failed, {:.1} tok/s, TTFT p50/p99 {:.0}/{:.0} ms, latency p50/p99 {:.0}/{:.0} ms",
                s.requests, s.failed, s.tokens_per_second, s.ttft_ms[0], s.ttft_ms[2], s.e2e_ms[0], s.e2e_ms[2]
            );
        }
        Command::Suite(args) => {
            let out = args.out.clone();
            suite::run(args).await?;
            let files = report::write(&out)?;
            eprintln!("suite: wrote {} in {}", files.join(", "), out.display());
        }
        Command::Report { out } => {
            let files = report::write(&out)?;
            eprintln!("report: wrote {} in {}", files.join(", "), out.display());
        }
        Command::FakeServer(args) => fake_server::run(args).await?,
    }
    Ok(())
}
