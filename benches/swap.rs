//! Swap cost: time from the scheduler's decision to switch checkpoints to
//! the next forward reading the new weight table, over many swaps between
//! resident checkpoints; next to it, the process-restart baseline (start a
//! server on the other model and wait for its first token), measured in
//! the same run.
//!
//! ```text
//! cargo bench --bench swap -- [--swaps 10000] [--model PATH] [--restarts 3]
//! ```
//!
//! Two checkpoints each get one long greedy sequence; with equal claims the
//! scheduler alternates between them every step, so every step is a swap.
//! The swap phase runs on two tiny synthetic checkpoints (a pointer swap
//! costs the same whatever the model's size, and tiny steps let 10,000
//! swaps finish in seconds), then on the real model and its Q8_0
//! re-quantization for a smaller count, to show the size does not matter.

#[path = "support/device.rs"]
mod device;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use device::on_bench_device;
use switchyard_engine::registry::Registry;
use switchyard_engine::repository::demo::{make_demo_repository, DemoOptions, DEFAULT_DERIVED};
use switchyard_engine::sampling::{SamplingParams, StopCondition};
use switchyard_engine::serving::{
    CheckpointId, Executor, ExecutorConfig, ExecutorObserver, SequenceEvent, SequenceRequest,
};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::{Backend, DType};

/// Keeps every swap latency.
#[derive(Default)]
struct SwapSamples(Mutex<Vec<Duration>>);

impl ExecutorObserver for SwapSamples {
    fn swap(&self, from: Option<&CheckpointId>, _to: &CheckpointId, latency: Duration) {
        if from.is_some() {
            if let Ok(mut samples) = self.0.lock() {
                samples.push(latency);
            }
        }
    }
}

/// Runs `swaps` swaps between two resident checkpoints (on one thread of
/// the bench device); returns the sorted latencies.
fn measure_swaps(paths: [&Path; 2], swaps: usize) -> Vec<Duration> {
    on_bench_device(1, Swaps { paths, swaps })
}

struct Swaps<'a> {
    paths: [&'a Path; 2],
    swaps: usize,
}

impl OnDevice for Swaps<'_> {
    type Output = Vec<Duration>;

    fn run<B: Backend>(self, backend: Arc<B>) -> Vec<Duration> {
        swaps_on(backend, self.paths, self.swaps)
    }
}

fn swaps_on<B: Backend>(backend: Arc<B>, paths: [&Path; 2], swaps: usize) -> Vec<Duration> {
    let registry = Registry::new(backend.clone(), None);
    for (i, path) in paths.iter().enumerate() {
        let name = format!("m{i}");
        registry.register(&name, "1", path, &[]);
        registry.load(&name, "1").expect("the checkpoint loads");
        registry.activate(&name, "1").expect("it activates");
    }
    let samples = Arc::new(SwapSamples::default());
    let executor = Executor::spawn(backend, ExecutorConfig::default(), samples.clone())
        .expect("the executor starts");
    let mut receivers = Vec::new();
    // Each step runs one checkpoint's single decode row; the other's claim
    // then wins, so steps alternate. A sequence holds at most its context,
    // so fresh sequences are queued until enough swaps are seen.
    while samples.0.lock().map(|s| s.len()).unwrap_or(0) < swaps {
        for i in 0..2 {
            let checkpoint = registry.resolve(&format!("m{i}")).expect("resident");
            let context = checkpoint.model.config().context_length;
            let (sender, receiver) = mpsc::channel();
            let request = SequenceRequest {
                prompt: vec![1, 2, 3],
                sampling: SamplingParams::default(),
                stop: StopCondition {
                    max_tokens: Some((context - 4).min(2048)),
                    ..StopCondition::default()
                },
                decoder: None,
                sink: Box::new(sender),
                deadline: None,
                constraint: None,
                cache_scope: switchyard_seam::CacheScope::default(),
                share: switchyard_seam::TenantShare::default(),
                task: Default::default(),
            };
            executor.submit(&checkpoint, request).expect("submitted");
            receivers.push(receiver);
        }
        for receiver in receivers.drain(..) {
            while let Ok(event) = receiver.recv() {
                if matches!(event, SequenceEvent::Done { .. } | SequenceEvent::Error(_)) {
                    break;
                }
            }
        }
    }
    executor.shutdown();
    let mut latencies = samples.0.lock().map(|s| s.clone()).unwrap_or_default();
    latencies.truncate(swaps);
    latencies.sort();
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(rank).copied().unwrap_or_default()
}

fn report(label: &str, latencies: &[Duration]) {
    println!(
        "| {label} | {} | {:.2} | {:.2} | {:.2} |",
        latencies.len(),
        percentile(latencies, 0.5).as_secs_f64() * 1e6,
        percentile(latencies, 0.99).as_secs_f64() * 1e6,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e6,
    );
}

/// Starts `switchyard serve` on `model` and waits for the first token of
/// a one-token completion: what changing models costs without hot-swap.
fn restart_to_first_token(binary: &Path, model: &Path, port: u16) -> Duration {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--model"])
        .arg(model)
        .args(["--model-name", "m"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("switchyard serve starts");
    let body = r#"{"model":"m","prompt":"Hello","max_tokens":1,"temperature":0}"#;
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let elapsed = loop {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let mut response = String::new();
            if stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut response).is_ok()
                && response.starts_with("HTTP/1.1 200")
            {
                break started.elapsed();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the server never answered"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = child.kill();
    let _ = child.wait();
    elapsed
}

fn default_model() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn main() {
    let mut swaps = 10_000;
    let mut restarts = 3;
    let mut model = default_model();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--swaps" => swaps = args.next().and_then(|v| v.parse().ok()).unwrap_or(swaps),
            "--restarts" => restarts = args.next().and_then(|v| v.parse().ok()).unwrap_or(restarts),
            "--model" => model = args.next().map(PathBuf::from).unwrap_or(model),
            _ => {}
        }
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let tiny: Vec<PathBuf> = (0..2u64)
        .map(|seed| {
            let path = dir.path().join(format!("tiny-{seed}.gguf"));
            let spec = SyntheticSpec {
                preset: Preset::Smollm2,
                dtype: DType::Q8_0,
                seed,
            };
            write_gguf(&spec, &path).expect("the synthetic checkpoint is written");
            path
        })
        .collect();
    // The real model and its Q8_0 re-quantization (distinct tensors), as
    // versions 1 and 2 of the demo repository.
    let demo = make_demo_repository(
        &DemoOptions {
            base: model.clone(),
            out: dir.path().join("demo"),
            derived: DEFAULT_DERIVED,
        },
        &mut |_| {},
    )
    .expect("the demo repository is made from the real model");
    let version = |v: &str| {
        demo.checkpoints
            .iter()
            .find(|c| c.model == "smollm2" && c.version == v)
            .map(|c| c.path.clone())
            .expect("the demo has smollm2 versions 1 and 2")
    };
    let (model, requantized) = (version("1"), version("2"));

    println!("| checkpoints | swaps | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|");
    report(
        "two synthetic (tiny)",
        &measure_swaps([&tiny[0], &tiny[1]], swaps),
    );
    report(
        "SmolLM2 Q4_1 ↔ its Q8_0",
        &measure_swaps([&model, &requantized], (swaps / 10).max(100)),
    );

    let binary = Path::new(env!("CARGO_BIN_EXE_switchyard"));
    let mut restart_times: Vec<Duration> = (0..restarts)
        .map(|i| {
            let target = if i % 2 == 0 { &requantized } else { &model };
            restart_to_first_token(binary, target, 18_600 + i as u16)
        })
        .collect();
    restart_times.sort();
    println!();
    println!("| process-restart baseline | runs | p50 ms | max ms |");
    println!("|---|---|---|---|");
    println!(
        "| start `switchyard serve` on the other model, wait for its first token | {} | {:.0} | {:.0} |",
        restart_times.len(),
        percentile(&restart_times, 0.5).as_secs_f64() * 1e3,
        restart_times.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}
