//! Load generator for a running `switchyard serve`: N concurrent streaming
//! chat clients for a bounded time, per concurrency level.
//!
//! ```text
//! cargo bench --bench load -- --url http://127.0.0.1:8080 --model NAME \
//!     --clients 1,4,16,64 --seconds 20 --max-tokens 64
//! ```
//!
//! `--model a,b,c,d` spreads the requests evenly over several models
//! (request `i` goes to model `i mod 4`): the mixed-traffic measurement.
//!
//! Each client sends streamed chat completions back to back (with
//! `stream_options.include_usage`, so generated tokens are the server's
//! count) until the time is up; requests started before the deadline finish.
//! A request fails on a non-200 status, a transport error, or a stream that
//! ends without `data: [DONE]`. Prints one Markdown table row per level.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

struct Options {
    url: String,
    /// Request `i` goes to `models[i % models.len()]`.
    models: Vec<String>,
    clients: Vec<usize>,
    seconds: u64,
    max_tokens: u32,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        url: "http://127.0.0.1:8080".into(),
        models: vec!["SmolLM2-135M-Instruct.Q4_1".into()],
        clients: vec![1, 4, 16, 64],
        seconds: 20,
        max_tokens: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => o.url = value()?,
            "--model" => {
                o.models = value()?.split(',').map(|m| m.trim().to_owned()).collect();
            }
            "--clients" => {
                o.clients = value()?
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse()
                            .map_err(|_| format!("--clients: bad count `{c}`"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => o.seconds = value()?.parse().map_err(|_| "--seconds: not a number")?,
            "--max-tokens" => {
                o.max_tokens = value()?.parse().map_err(|_| "--max-tokens: not a number")?
            }
            // `cargo bench` passes `--bench`; nothing else is expected.
            "--bench" => {}
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(o)
}

/// What one request measured.
struct Sample {
    ok: bool,
    tokens: u64,
    latency: Duration,
    first_token: Option<Duration>,
}

const PROMPTS: &[&str] = &[
    "Write a short poem about the sea.",
    "Explain what a CPU cache is.",
    "List five fruits and their colors.",
    "Tell me a story about a robot who learns to paint.",
    "What is the capital of France? Explain its history briefly.",
];

async fn one_request(http: &reqwest::Client, o: &Options, i: u64) -> Sample {
    let body = serde_json::json!({
        "model": o.models[i as usize % o.models.len()],
        "messages": [{"role": "user", "content": PROMPTS[i as usize % PROMPTS.len()]}],
        "max_tokens": o.max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let mut sample = Sample {
        ok: false,
        tokens: 0,
        latency: Duration::ZERO,
        first_token: None,
    };
    let response = match http
        .post(format!("{}/v1/chat/completions", o.url))
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            eprintln!("request failed: HTTP {}", r.status());
            sample.latency = start.elapsed();
            return sample;
        }
        Err(e) => {
            eprintln!("request failed: {e}");
            sample.latency = start.elapsed();
            return sample;
        }
    };
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut done = false;
    while let Some(piece) = stream.next().await {
        let Ok(piece) = piece else { break };
        buffer.push_str(&String::from_utf8_lossy(&piece));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(json) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            let content = json["choices"][0]["delta"]["content"].as_str();
            if sample.first_token.is_none() && content.is_some_and(|c| !c.is_empty()) {
                sample.first_token = Some(start.elapsed());
            }
            if let Some(tokens) = json["usage"]["completion_tokens"].as_u64() {
                sample.tokens = tokens;
            }
        }
    }
    sample.ok = done;
    if !done {
        eprintln!("request failed: the stream ended without [DONE]");
    }
    sample.latency = start.elapsed();
    sample
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn level(http: &reqwest::Client, o: &Options, clients: usize) -> String {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(o.seconds);
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let http = http.clone();
            let counter = counter.clone();
            let o = Options {
                url: o.url.clone(),
                models: o.models.clone(),
                clients: Vec::new(),
                seconds: o.seconds,
                max_tokens: o.max_tokens,
            };
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while Instant::now() < deadline {
                    let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    samples.push(one_request(&http, &o, i).await);
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        match task.await {
            Ok(s) => samples.extend(s),
            Err(e) => eprintln!("a client task failed: {e}"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let failed = samples.iter().filter(|s| !s.ok).count();
    let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
    let mut latencies: Vec<Duration> = samples.iter().filter(|s| s.ok).map(|s| s.latency).collect();
    latencies.sort();
    let mut ttfts: Vec<Duration> = samples.iter().filter_map(|s| s.first_token).collect();
    ttfts.sort();
    format!(
        "| {clients} | {} | {failed} | {tokens} | {:.1} | {:.2} | {:.2} | {:.3} | {:.3} |",
        samples.len(),
        tokens as f64 / elapsed,
        percentile(&latencies, 0.5).as_secs_f64(),
        percentile(&latencies, 0.99).as_secs_f64(),
        percentile(&ttfts, 0.5).as_secs_f64(),
        percentile(&ttfts, 0.99).as_secs_f64(),
    )
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("load: cannot start tokio: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async {
        let http = reqwest::Client::new();
        println!(
            "| clients | requests | failed | tokens | gen tok/s | p50 latency s | p99 latency s | p50 TTFT s | p99 TTFT s |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for &clients in &o.clients {
            println!("{}", level(&http, &o, clients).await);
        }
    });
}
