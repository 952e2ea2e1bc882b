//! Decode speed with a JSON schema against unconstrained decode, through
//! the engine's front door (grammar compiled in `prepare`, a mask applied
//! to every row the executor samples), at batch 1 and 16, interleaved:
//! each round times all four runs back to back in alternating order, so
//! every ratio compares measurements taken seconds apart under the same
//! load (the shared machines drift by tens of percent over minutes).
//!
//! Every sequence decodes exactly `MAX_TOKENS` tokens: the end-of-sequence
//! ids get a -100 bias in both runs, and the schema's `minItems` keeps the
//! JSON open past the limit, so both runs keep the whole batch busy.
//! Decode time runs from the moment every sequence has its first token
//! (prefill and grammar compile done) to the last `Done`.
//!
//! `cargo bench --bench structured_decode -- [rounds]` (default 5); threads
//! from `SWITCHYARD_BENCH_THREADS` (default 2). Prints Markdown.

#[path = "support/batched.rs"]
#[allow(dead_code)]
mod batched;
#[path = "support/device.rs"]
mod device;
#[path = "support/rounds.rs"]
mod rounds;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use batched::{model_path, threads};
use device::on_bench_device;
use rounds::{rounds_arg, summary};
use switchyard_engine::registry::Registry;
use switchyard_engine::serving::{Executor, ExecutorConfig, NoObserver};
use switchyard_engine::Engine;
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::Backend;
use switchyard_seam::{
    ChatMessage, Constraint, GenerationEvent, GenerationRequest, InferenceBackend, Prompt, Role,
    SamplingOptions,
};

const MAX_TOKENS: u32 = 48;
const BATCHES: [usize; 2] = [1, 16];
/// The issue's target: constrained decode at least this fraction of unconstrained.
const TARGET: f64 = 0.8;
/// A record type with nested objects, enums, bounded numbers and strings:
/// the mask changes its shape every few tokens.
const SCHEMA: &str = r#"{"type": "object", "properties": {"people": {"type": "array", "minItems": 40,
  "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["engineer", "doctor", "artist", "farmer"]}},
  "required": ["name", "age", "role"], "additionalProperties": false}}},
  "required": ["people"], "additionalProperties": false}"#;

fn main() {
    let rounds = rounds_arg(5);
    on_bench_device(threads(), Rounds(rounds));
}

/// The whole bench on whichever backend `SWITCHYARD_BENCH_DEVICE` names.
struct Rounds(usize);

impl OnDevice for Rounds {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) {
        rounds_on(backend, self.0);
    }
}

fn rounds_on<B: Backend>(backend: Arc<B>, rounds: usize) {
    let engine = engine(backend);
    let eos = engine
        .registry()
        .resolve("m")
        .expect("resident")
        .tokenizer
        .eos_ids()
        .to_vec();
    // Warm-up: pages the weights in and builds the grammar vocabulary.
    for batch in BATCHES {
        for constrained in [false, true] {
            decode_rate(&engine, &eos, batch, constrained);
        }
    }
    // rates[round][(batch, constrained)], tokens per second.
    let mut rates: Vec<BTreeMap<(usize, bool), f64>> = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut runs: Vec<(usize, bool)> = BATCHES
            .iter()
            .flat_map(|&b| [(b, false), (b, true)])
            .collect();
        if round % 2 == 1 {
            runs.reverse();
        }
        let rate: BTreeMap<_, _> = runs
            .into_iter()
            .map(|(b, c)| ((b, c), decode_rate(&engine, &eos, b, c)))
            .collect();
        eprintln!("round {round}: {rate:?}");
        rates.push(rate);
    }
    println!(
        "| batch | unconstrained tok/s | JSON schema tok/s | ratio, median of rounds (range) |"
    );
    println!("| --- | --- | --- | --- |");
    for batch in BATCHES {
        let free: Vec<f64> = rates.iter().map(|r| r[&(batch, false)]).collect();
        let json: Vec<f64> = rates.iter().map(|r| r[&(batch, true)]).collect();
        let ratio: Vec<f64> = free.iter().zip(&json).map(|(f, j)| j / f).collect();
        let (rm, rlo, rhi) = summary(&ratio);
        let met = ratio.iter().filter(|&&r| r >= TARGET).count();
        println!(
            "| {batch} | {:.1} | {:.1} | {rm:.2}x ({rlo:.2}-{rhi:.2}; >= {TARGET} in {met} of {}) |",
            summary(&free).0,
            summary(&json).0,
            ratio.len()
        );
    }
    println!(
        "\n{rounds} rounds, {} threads, {MAX_TOKENS} tokens per sequence.",
        threads()
    );
}

fn engine<B: Backend>(backend: Arc<B>) -> Engine<B> {
    let registry = Arc::new(Registry::new(backend.clone(), None));
    registry.register("m", "1", &model_path(), &[]);
    if let Err(e) = registry.load("m", "1") {
        panic!("run scripts/fetch-model.sh first: {e}");
    }
    registry.activate("m", "1").expect("it activates");
    let executor = Executor::spawn(backend, ExecutorConfig::default(), Arc::new(NoObserver))
        .expect("the executor starts");
    Engine::new(registry, executor, 0)
}

/// Decode tokens per second of `batch` sequences decoding together.
fn decode_rate<B: Backend>(
    engine: &Engine<B>,
    eos: &[u32],
    batch: usize,
    constrained: bool,
) -> f64 {
    let requests: Vec<GenerationRequest> = (0..batch)
        .map(|i| GenerationRequest {
            request_id: format!("bench/{i}"),
            model: "m".into(),
            prompt: Prompt::Chat(vec![ChatMessage::new(
                Role::User,
                format!("List forty people with their age and job, as JSON ({i})."),
            )]),
            max_tokens: Some(MAX_TOKENS),
            sampling: SamplingOptions {
                temperature: Some(0.0),
                logit_bias: eos.iter().map(|&id| (id, -100.0)).collect(),
                ..SamplingOptions::default()
            },
            stop: Vec::new(),
            logprobs: None,
            user: None,
            tools: Vec::new(),
            constraint: constrained.then(|| Constraint::JsonSchema {
                schema: SCHEMA.into(),
                field: "response_format.json_schema.schema".into(),
            }),
            cache_scope: switchyard_seam::CacheScope::default(),
            share: switchyard_seam::TenantShare::default(),
            fanout: 1,
            deadline: None,
            stop_unsure: None,
            answer_prefix: None,
        })
        .collect();
    let mut streams: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).expect("accepted"))
        .collect();
    // Every sequence's first token, then every Done.
    let mut decoded = 0usize;
    for stream in &mut streams {
        if let Some(GenerationEvent::Token(_)) = stream.blocking_recv() {
            continue;
        }
        panic!("no first token");
    }
    let started = Instant::now();
    for stream in &mut streams {
        while let Some(event) = stream.blocking_recv() {
            match event {
                GenerationEvent::Token(_) => decoded += 1,
                GenerationEvent::Done { .. } => break,
                GenerationEvent::Error(e) => panic!("{e}"),
            }
        }
    }
    decoded as f64 / started.elapsed().as_secs_f64()
}
