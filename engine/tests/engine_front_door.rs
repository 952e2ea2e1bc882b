//! The engine's front door: a seam request in, a stream of events out. What it
//! generates equals the model run directly; every refusal names the field, with
//! the request's own numbers, before anything is queued.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use switchyard_engine::model::LogitRows;
use switchyard_engine::registry::Registry;
use switchyard_engine::sampling::argmax;
use switchyard_engine::serving::{Executor, ExecutorConfig, NoObserver};
use switchyard_engine::session::Session;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::Engine;
use switchyard_kernels::{on_each_device, Backend, DType};
use switchyard_seam::{
    BackendError, ChatMessage, FinishReason, GenerationEvent, GenerationRequest, InferenceBackend,
    MarginStatistic, Prompt, Role, SamplingOptions, UnsureStop,
};

/// The synthetic presets' context window.
const CONTEXT: u32 = 256;

fn engine<B: Backend>(backend: Arc<B>, dir: &Path) -> (Engine<B>, Arc<B>) {
    let path = dir.join("tiny.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 7,
    };
    write_gguf(&spec, &path).unwrap();
    let registry = Arc::new(Registry::new(backend.clone(), None));
    registry.register("tiny", "1", &path, &[]);
    registry.load("tiny", "1").unwrap();
    registry.activate("tiny", "1").unwrap();
    let executor = Executor::spawn(
        backend.clone(),
        ExecutorConfig::default(),
        Arc::new(NoObserver),
    )
    .unwrap();
    let engine = Engine::new(registry, executor, 0);
    (engine, backend)
}

fn request(prompt: Prompt, max_tokens: Option<u32>) -> GenerationRequest {
    GenerationRequest {
        request_id: "test".into(),
        model: "tiny".into(),
        prompt,
        max_tokens,
        sampling: SamplingOptions {
            temperature: Some(0.0),
            ..SamplingOptions::default()
        },
        stop: Vec::new(),
        logprobs: None,
        user: None,
        tools: Vec::new(),
        constraint: None,
        cache_scope: switchyard_seam::CacheScope::default(),
        share: switchyard_seam::TenantShare::default(),
        fanout: 1,
        deadline: None,
        stop_unsure: None,
        answer_prefix: None,
    }
}

/// Every event of one generation, in order.
fn run<B: Backend>(engine: &Engine<B>, request: GenerationRequest) -> Vec<GenerationEvent> {
    let mut stream = engine.submit(request).unwrap();
    let mut events = Vec::new();
    while let Some(event) = stream.blocking_recv() {
        events.push(event);
    }
    events
}

fn refusal<B: Backend>(engine: &Engine<B>, request: GenerationRequest) -> BackendError {
    match engine.submit(request) {
        Ok(_) => panic!("the request was accepted"),
        Err(error) => error,
    }
}

fn greedy_tokens_equal_the_model_run_directly<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, backend) = engine(backend, dir.path());
    let prompt = vec![1u32, 5, 9, 2, 40];
    let events = run(&engine, request(Prompt::Tokens(prompt.clone()), Some(8)));

    let checkpoint = engine.registry().resolve("tiny").unwrap();
    let mut session = Session::new(&*backend, &checkpoint.model, prompt.len() + 8).unwrap();
    let mut logits = session.feed(&prompt, LogitRows::Last).unwrap();
    let mut expected = Vec::new();
    for _ in 0..8 {
        let id = argmax(&logits);
        expected.push(id);
        logits = session.decode(&[id], LogitRows::Last).unwrap();
    }
    let eos = checkpoint.tokenizer.eos_ids().to_vec();
    let expected: Vec<u32> = expected
        .into_iter()
        .take_while(|id| !eos.contains(id))
        .collect();

    let generated: Vec<u32> = events
        .iter()
        .filter_map(|event| match event {
            GenerationEvent::Token(token) => Some(token.id),
            _ => None,
        })
        .collect();
    assert_eq!(generated, expected);
    match events.last() {
        Some(GenerationEvent::Done {
            usage,
            finish_reason,
            ..
        }) => {
            assert_eq!(usage.prompt_tokens, 5);
            let reason = if expected.len() == 8 {
                FinishReason::Length
            } else {
                FinishReason::Stop
            };
            assert_eq!(*finish_reason, reason);
        }
        other => panic!("the generation did not end with Done: {other:?}"),
    }
}

on_each_device!(greedy_tokens_equal_the_model_run_directly, threads = 1);

/// The first token's margin and entropy, computed by hand (f64) from the logits the
/// model gives the prompt, equal what the engine reports; an unsure stop above that
/// margin ends the generation after the token, one below it changes nothing.
fn the_first_tokens_margin_is_computed_from_its_logits<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, backend) = engine(backend, dir.path());
    let prompt = vec![1u32, 5, 9, 2, 40];
    let events = run(&engine, request(Prompt::Tokens(prompt.clone()), Some(4)));

    let checkpoint = engine.registry().resolve("tiny").unwrap();
    let mut session = Session::new(&*backend, &checkpoint.model, prompt.len() + 1).unwrap();
    let logits = session.feed(&prompt, LogitRows::Last).unwrap();
    let mut sorted: Vec<f64> = logits.iter().map(|&l| f64::from(l)).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let best = sorted[0];
    let gap = best - sorted[1];
    let z: f64 = sorted.iter().map(|l| (l - best).exp()).sum();
    let entropy: f64 = -sorted
        .iter()
        .map(|l| {
            let p = (l - best).exp() / z;
            if p > 0.0 {
                p * p.ln()
            } else {
                0.0
            }
        })
        .sum::<f64>();

    let first = match &events[0] {
        GenerationEvent::Token(token) => token.margin.unwrap(),
        other => panic!("the first event is not a token: {other:?}"),
    };
    let close = |engine: f32, by_hand: f64| {
        (f64::from(engine) - by_hand).abs() <= 1e-3 * by_hand.abs().max(1.0)
    };
    assert!(
        close(first.margin, gap),
        "margin {} against {gap}",
        first.margin
    );
    assert!(
        close(first.entropy, entropy),
        "entropy {} against {entropy}",
        first.entropy
    );
    let tokens = events.len() - 1;
    match events.last() {
        Some(GenerationEvent::Done {
            confidence: Some(confidence),
            ..
        }) => {
            assert_eq!(confidence.first, Some(first));
            assert!(confidence.min_margin.unwrap() <= first.margin);
        }
        other => panic!("no Done with a confidence: {other:?}"),
    }

    let stopped_by = |min: f64, every_token: bool| {
        let mut r = request(Prompt::Tokens(prompt.clone()), Some(4));
        r.stop_unsure = Some(UnsureStop {
            statistic: MarginStatistic::Margin,
            min,
            every_token,
        });
        run(&engine, r)
    };
    let stopped = |min: f64| stopped_by(min, false);
    let events = stopped(f64::from(first.margin) + 0.01);
    assert_eq!(events.len(), 2, "{events:?}");
    match events.last() {
        Some(GenerationEvent::Done {
            finish_reason,
            usage,
            ..
        }) => {
            assert_eq!(*finish_reason, FinishReason::Unsure);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 1));
        }
        other => panic!("no Done: {other:?}"),
    }
    assert_eq!(stopped(f64::from(first.margin) - 0.01).len() - 1, tokens);

    // An every-token stop (a cascade under `min_margin`) ends the answer at its first
    // token below the threshold, wherever it is; above every margin it runs to the end.
    let margins: Vec<f32> = events
        .iter()
        .filter_map(|e| match e {
            GenerationEvent::Token(t) => t.margin.map(|m| m.margin),
            _ => None,
        })
        .collect();
    let smallest = margins.iter().copied().fold(f32::INFINITY, f32::min);
    let min = f64::from(smallest) + 0.01;
    let at = margins.iter().position(|&m| f64::from(m) < min).unwrap();
    let events = stopped_by(min, true);
    match events.last() {
        Some(GenerationEvent::Done {
            finish_reason,
            usage,
            confidence: Some(confidence),
        }) => {
            assert_eq!(*finish_reason, FinishReason::Unsure);
            assert_eq!(usage.completion_tokens as usize, at + 1, "{margins:?}");
            assert_eq!(confidence.min_margin, Some(margins[at]));
        }
        other => panic!("no Done: {other:?}"),
    }
    assert_eq!(
        stopped_by(f64::from(smallest) - 0.01, true).len() - 1,
        tokens
    );
}

on_each_device!(
    the_first_tokens_margin_is_computed_from_its_logits,
    threads = 1
);

fn chat_and_text_prompts_go_through_the_template_and_tokenizer<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _backend) = engine(backend, dir.path());
    let checkpoint = engine.registry().resolve("tiny").unwrap();
    let messages = vec![
        ChatMessage::new(Role::Developer, "Be brief."),
        ChatMessage::new(Role::User, "hello"),
    ];
    let text = checkpoint
        .template
        .render(
            &messages,
            true,
            checkpoint.tokenizer.bos_token(),
            checkpoint.tokenizer.eos_token(),
        )
        .unwrap();
    // Templates know no developer role: it is rendered as the system turn.
    let as_system = [
        ChatMessage::new(Role::System, "Be brief."),
        messages[1].clone(),
    ];
    let system_text = checkpoint
        .template
        .render(
            &as_system,
            true,
            checkpoint.tokenizer.bos_token(),
            checkpoint.tokenizer.eos_token(),
        )
        .unwrap();
    assert_eq!(text, system_text);
    let ids = checkpoint.tokenizer.encode(&text, false).unwrap();

    let events = run(&engine, request(Prompt::Chat(messages), Some(2)));
    match events.last() {
        Some(GenerationEvent::Done { usage, .. }) => {
            assert_eq!(usage.prompt_tokens as usize, ids.len())
        }
        other => panic!("no Done: {other:?}"),
    }
    let events = run(
        &engine,
        request(Prompt::Text("hello world".into()), Some(2)),
    );
    assert!(matches!(events.last(), Some(GenerationEvent::Done { .. })));
}

on_each_device!(
    chat_and_text_prompts_go_through_the_template_and_tokenizer,
    threads = 1
);

fn refusals_name_the_field_with_the_requests_numbers<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _backend) = engine(backend, dir.path());

    let mut unknown = request(Prompt::Tokens(vec![1, 2]), Some(1));
    unknown.model = "nope".into();
    assert_eq!(
        refusal(&engine, unknown),
        BackendError::UnknownModel {
            model: "nope".into()
        }
    );

    let prompt: Vec<u32> = (1..=200).collect();
    assert_eq!(
        refusal(&engine, request(Prompt::Tokens(prompt.clone()), Some(57))),
        BackendError::ContextOverflow {
            prompt_tokens: 200,
            max_tokens: 57,
            context: CONTEXT
        }
    );
    let full: Vec<u32> = (0..CONTEXT).map(|i| i % 300).collect();
    assert_eq!(
        refusal(&engine, request(Prompt::Tokens(full), None)),
        BackendError::ContextOverflow {
            prompt_tokens: CONTEXT,
            max_tokens: 0,
            context: CONTEXT
        }
    );

    let field = |error: BackendError| match error {
        BackendError::InvalidRequest { param, .. } => param,
        other => panic!("expected InvalidRequest, got {other:?}"),
    };
    assert_eq!(
        field(refusal(
            &engine,
            request(Prompt::Tokens(vec![1, 320]), None)
        )),
        "prompt"
    );
    assert_eq!(
        field(refusal(&engine, request(Prompt::Tokens(Vec::new()), None))),
        "prompt"
    );
    let mut hot = request(Prompt::Tokens(vec![1, 2]), None);
    hot.sampling.temperature = Some(3.0);
    assert_eq!(field(refusal(&engine, hot)), "temperature");
    let mut bias = request(Prompt::Tokens(vec![1, 2]), None);
    bias.sampling.logit_bias.insert(320, 1.0);
    assert_eq!(field(refusal(&engine, bias)), "logit_bias");
    let mut alternatives = request(Prompt::Chat(vec![ChatMessage::new(Role::User, "hi")]), None);
    alternatives.logprobs = Some(21);
    assert_eq!(field(refusal(&engine, alternatives)), "top_logprobs");
    // Nothing refused was queued.
    assert_eq!(engine.executor().queue_depth(), 0);
}

on_each_device!(
    refusals_name_the_field_with_the_requests_numbers,
    threads = 1
);
