//! Sends the schedule as streaming chat completions, open loop (each request
//! at its arrival time, whatever the server's state) or closed loop (N
//! clients, each sending its next request when the previous one ends), and
//! records what each request saw.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::workload::Planned;

/// What one request measured. Times are milliseconds from its send.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub model: String,
    /// Seconds from the start of the run at which it was sent.
    pub sent_at: f64,
    /// HTTP status, or 0 for a transport error or a stream cut short.
    pub status: u16,
    pub ok: bool,
    pub error: Option<String>,
    pub ttft_ms: Option<f64>,
    pub inter_token_ms: Vec<f64>,
    pub e2e_ms: f64,
    pub tokens: u64,
}

/// How the schedule is sent.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Each request at its `at_seconds`.
    Open,
    /// This many clients, back to back, until the schedule or `seconds` runs out.
    Closed { clients: usize, seconds: f64 },
}

/// The longest one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn run(base_url: &str, plan: Vec<Planned>, mode: Mode) -> Vec<Record> {
    let http = match reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => {
            return plan
                .iter()
                .map(|p| failed(p, 0.0, format!("no HTTP client: {e}")))
                .collect()
        }
    };
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let start = Instant::now();
    let plan = Arc::new(plan);
    let mut tasks = Vec::new();
    match mode {
        Mode::Open => {
            for index in 0..plan.len() {
                let (http, url, plan) = (http.clone(), url.clone(), plan.clone());
                let at = Duration::from_secs_f64(plan[index].at_seconds);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until((start + at).into()).await;
                    vec![send(&http, &url, &plan[index], start).await]
                }));
            }
        }
        Mode::Closed { clients, seconds } => {
            let next = Arc::new(AtomicUsize::new(0));
            let deadline = start + Duration::from_secs_f64(seconds);
            for _ in 0..clients {
                let (http, url, plan, next) =
                    (http.clone(), url.clone(), plan.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    let mut records = Vec::new();
                    while Instant::now() < deadline {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(planned) = plan.get(index) else {
                            break;
                        };
                        records.push(send(&http, &url, planned, start).await);
                    }
                    records
                }));
            }
        }
    }
    let mut records = Vec::new();
    for task in tasks {
        match task.await {
            Ok(done) => records.extend(done),
            Err(e) => records.push(Record {
                model: String::new(),
                sent_at: 0.0,
                status: 0,
                ok: false,
                error: Some(format!("client task failed: {e}")),
                ttft_ms: None,
                inter_token_ms: Vec::new(),
                e2e_ms: 0.0,
                tokens: 0,
            }),
        }
    }
    records.sort_by(|a, b| a.sent_at.total_cmp(&b.sent_at));
    records
}

fn failed(planned: &Planned, sent_at: f64, error: String) -> Record {
    Record {
        model: planned.model.clone(),
        sent_at,
        status: 0,
        ok: false,
        error: Some(error),
        ttft_ms: None,
        inter_token_ms: Vec::new(),
        e2e_ms: 0.0,
        tokens: 0,
    }
}

/// One streamed chat completion. It succeeds on a 200 whose stream ends with
/// `data: [DONE]`; tokens are the server's usage count when it sends one,
/// else the content chunks (one token each on both servers measured).
async fn send(http: &reqwest::Client, url: &str, planned: &Planned, start: Instant) -> Record {
    let sent = Instant::now();
    let sent_at = sent.duration_since(start).as_secs_f64();
    let body = serde_json::json!({
        "model": planned.model,
        "messages": [{"role": "user", "content": planned.prompt}],
        "max_tokens": planned.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let response = match http.post(url).json(&body).send().await {
        Ok(response) => response,
        Err(e) => return failed(planned, sent_at, format!("send: {e}")),
    };
    let status = response.status().as_u16();
    let mut record = Record {
        status,
        error: None,
        ..failed(planned, sent_at, String::new())
    };
    if status != 200 {
        record.error = Some(format!("HTTP {status}"));
        record.e2e_ms = ms(sent.elapsed());
        return record;
    }
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut last_token: Option<Instant> = None;
    let mut chunks = 0u64;
    let mut usage = None;
    let mut done = false;
    while let Some(piece) = stream.next().await {
        let piece = match piece {
            Ok(piece) => piece,
            Err(e) => {
                record.error = Some(format!("stream: {e}"));
                break;
            }
        };
        buffer.extend_from_slice(&piece);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(event) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                usage = Some(n);
            }
            let content = event["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default();
            if !content.is_empty() {
                let now = Instant::now();
                match last_token {
                    None => record.ttft_ms = Some(ms(now - sent)),
                    Some(previous) => record.inter_token_ms.push(ms(now - previous)),
                }
                last_token = Some(now);
                chunks += 1;
            }
        }
    }
    record.e2e_ms = ms(sent.elapsed());
    record.tokens = usage.unwrap_or(chunks);
    record.ok = done && record.error.is_none();
    if !done && record.error.is_none() {
        record.status = 0;
        record.error = Some("stream ended without [DONE]".into());
    }
    record
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
