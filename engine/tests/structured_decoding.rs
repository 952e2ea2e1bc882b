//! Constrained decoding through the engine's front door, on a synthetic
//! model with random weights: whatever the model prefers, the output follows
//! the grammar, because the mask leaves it no other token. Refusals of what
//! the grammar engine cannot enforce name the field and disturb nothing.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use switchyard_engine::registry::Registry;
use switchyard_engine::serving::{Executor, ExecutorConfig, NoObserver};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::Engine;
use switchyard_kernels::{on_each_device, Backend, DType};
use switchyard_seam::{
    BackendError, ChatMessage, Constraint, FinishReason, GenerationEvent, GenerationRequest,
    InferenceBackend, Prompt, Role, SamplingOptions, Tool,
};

const SCHEMA: &str = r#"{"type": "object",
  "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                 "ok": {"type": "boolean"},
                 "tag": {"enum": ["a", "bb"]}},
  "required": ["n", "ok", "tag"], "additionalProperties": false}"#;

fn engine<B: Backend>(backend: Arc<B>, dir: &Path) -> Engine<B> {
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
    let executor =
        Executor::spawn(backend, ExecutorConfig::default(), Arc::new(NoObserver)).unwrap();
    Engine::new(registry, executor, 0)
}

fn request(constraint: Constraint, tools: Vec<Tool>, seed: u64) -> GenerationRequest {
    // The tools' instructions would not fit the synthetic model's 256-token
    // context; token prompts carry no tools, and the grammar applies all the same.
    let prompt = if tools.is_empty() {
        Prompt::Chat(vec![ChatMessage::new(Role::User, "answer in JSON")])
    } else {
        Prompt::Tokens(vec![1, 5, 9, 2, 40])
    };
    GenerationRequest {
        request_id: format!("test/{seed}"),
        model: "tiny".into(),
        prompt,
        max_tokens: Some(120),
        sampling: SamplingOptions {
            temperature: Some(1.0),
            seed: Some(seed),
            ..SamplingOptions::default()
        },
        stop: Vec::new(),
        logprobs: None,
        user: None,
        tools,
        constraint: Some(constraint),
        cache_scope: switchyard_seam::CacheScope::default(),
        share: switchyard_seam::TenantShare::default(),
        fanout: 1,
        deadline: None,
        stop_unsure: None,
        answer_prefix: None,
    }
}

fn schema(text: &str) -> Constraint {
    Constraint::JsonSchema {
        schema: text.into(),
        field: "response_format.json_schema.schema".into(),
    }
}

/// The generated text and how it finished.
fn run<B: Backend>(engine: &Engine<B>, request: GenerationRequest) -> (String, FinishReason) {
    let mut stream = engine.submit(request).unwrap();
    let mut text = String::new();
    while let Some(event) = stream.blocking_recv() {
        match event {
            GenerationEvent::Token(token) => text.push_str(&token.text),
            GenerationEvent::Done { finish_reason, .. } => return (text, finish_reason),
            GenerationEvent::Error(error) => panic!("generation failed: {error}"),
        }
    }
    panic!("the stream ended without Done");
}

fn refusal<B: Backend>(engine: &Engine<B>, request: GenerationRequest) -> BackendError {
    match engine.submit(request) {
        Ok(_) => panic!("the request was accepted"),
        Err(error) => error,
    }
}

fn sampled_answers_of_a_random_model_follow_the_schema<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(backend, dir.path());
    for seed in 0..6 {
        let (text, finish) = run(&engine, request(schema(SCHEMA), Vec::new(), seed));
        assert_eq!(finish, FinishReason::Stop, "seed {seed}: {text:?}");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let object = value.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys, ["n", "ok", "tag"], "{text}");
        assert!((0..=99).contains(&object["n"].as_i64().unwrap()), "{text}");
        assert!(object["ok"].is_boolean(), "{text}");
        assert!(
            ["a", "bb"].contains(&object["tag"].as_str().unwrap()),
            "{text}"
        );
    }
    let (text, _) = run(&engine, request(Constraint::JsonObject, Vec::new(), 1));
    assert!(text.starts_with('{'), "{text:?}");
}

on_each_device!(
    sampled_answers_of_a_random_model_follow_the_schema,
    threads = 1
);

/// Requests submitted together decode in one batch, where the step's masks
/// are computed in parallel: each sequence's output still follows its own
/// grammar, and an unconstrained neighbour is left free.
fn a_batch_of_constrained_sequences_each_follows_its_own_grammar<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(backend, dir.path());
    let flag = r#"{"type": "object", "properties": {"flag": {"type": "boolean"}},
        "required": ["flag"], "additionalProperties": false}"#;
    let streams: Vec<_> = (0..8)
        .map(|seed| {
            let constraint = if seed % 2 == 0 {
                schema(SCHEMA)
            } else {
                schema(flag)
            };
            engine
                .submit(request(constraint, Vec::new(), seed))
                .unwrap()
        })
        .collect();
    let mut free = request(Constraint::JsonObject, Vec::new(), 99);
    free.constraint = None;
    free.max_tokens = Some(16);
    let free = engine.submit(free).unwrap();
    for (seed, mut stream) in streams.into_iter().enumerate() {
        let mut text = String::new();
        while let Some(event) = stream.blocking_recv() {
            match event {
                GenerationEvent::Token(token) => text.push_str(&token.text),
                GenerationEvent::Done { .. } => break,
                GenerationEvent::Error(error) => panic!("seed {seed}: {error}"),
            }
        }
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let expected: &[&str] = if seed % 2 == 0 {
            &["n", "ok", "tag"]
        } else {
            &["flag"]
        };
        assert_eq!(keys, expected, "seed {seed}: {text}");
    }
    let mut free = free;
    let mut tokens = 0;
    while let Some(event) = free.blocking_recv() {
        match event {
            GenerationEvent::Token(_) => tokens += 1,
            GenerationEvent::Done { .. } => break,
            GenerationEvent::Error(error) => panic!("unconstrained: {error}"),
        }
    }
    assert!(tokens > 0, "the unconstrained request produced nothing");
}

on_each_device!(
    a_batch_of_constrained_sequences_each_follows_its_own_grammar,
    threads = 1
);

fn forced_tool_calls_name_a_listed_tool_with_valid_arguments<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(backend, dir.path());
    let tools = vec![
        Tool {
            name: "ping".into(),
            description: None,
            parameters: r#"{"type": "object", "properties": {"times": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["times"], "additionalProperties": false}"#.into(),
        },
        Tool {
            name: "stop".into(),
            description: Some("Stops.".into()),
            parameters: r#"{"type": "object", "properties": {}, "additionalProperties": false}"#.into(),
        },
    ];
    let forced = Constraint::ToolCalls {
        names: vec!["ping".into(), "stop".into()],
        parallel: false,
    };
    for seed in 0..4 {
        let (text, finish) = run(&engine, request(forced.clone(), tools.clone(), seed));
        assert_eq!(finish, FinishReason::Stop, "{text:?}");
        let body = text
            .strip_prefix("<tool_call>\n")
            .and_then(|rest| rest.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("not one call: {text:?}"));
        let call: Value = serde_json::from_str(body).unwrap();
        match call["name"].as_str() {
            Some("ping") => {
                assert!((1..=3).contains(&call["arguments"]["times"].as_i64().unwrap()))
            }
            Some("stop") => assert_eq!(call["arguments"], serde_json::json!({})),
            other => panic!("unknown tool {other:?} in {text}"),
        }
    }
}

on_each_device!(
    forced_tool_calls_name_a_listed_tool_with_valid_arguments,
    threads = 1
);

fn unenforceable_schemas_are_refused_naming_the_field_and_keyword<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(backend, dir.path());
    let unsupported = schema(r#"{"type": "array", "uniqueItems": true}"#);
    match refusal(&engine, request(unsupported, Vec::new(), 0)) {
        BackendError::InvalidRequest { param, message } => {
            assert_eq!(param, "response_format.json_schema.schema");
            assert!(message.contains("uniqueItems"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let bad_tool = Tool {
        name: "f".into(),
        description: None,
        parameters: r#"{"type": "object", "not": {"type": "null"}}"#.into(),
    };
    let fine_tool = Tool {
        name: "g".into(),
        description: None,
        parameters: "{}".into(),
    };
    let forced = Constraint::ToolCalls {
        names: vec!["g".into(), "f".into()],
        parallel: true,
    };
    match refusal(&engine, request(forced, vec![fine_tool, bad_tool], 0)) {
        BackendError::InvalidRequest { param, message } => {
            assert_eq!(param, "tools[1].function.parameters");
            assert!(message.contains("not"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Nothing else disturbed.
    let (text, finish) = run(&engine, request(schema(SCHEMA), Vec::new(), 9));
    assert_eq!(finish, FinishReason::Stop);
    assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text:?}");
}

on_each_device!(
    unenforceable_schemas_are_refused_naming_the_field_and_keyword,
    threads = 1
);

/// `{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ..., "dN": {"type": "integer"}},
/// "$ref": "#/$defs/d0"}`.
fn ref_chain(links: usize) -> String {
    let mut defs = serde_json::Map::new();
    for i in 0..links {
        defs.insert(
            format!("d{i}"),
            serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{links}"), serde_json::json!({"type": "integer"}));
    serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"}).to_string()
}

/// An object of `properties` integers; all required (in order), or all optional.
fn wide_object(properties: usize, required: bool) -> String {
    let names: Vec<String> = (0..properties).map(|i| format!("p{i}")).collect();
    let properties: serde_json::Map<String, Value> = names
        .iter()
        .map(|name| (name.clone(), serde_json::json!({"type": "integer"})))
        .collect();
    let mut schema = serde_json::json!({"type": "object", "properties": properties});
    if required {
        schema["required"] = serde_json::json!(names);
        schema["additionalProperties"] = serde_json::json!(false);
    }
    schema.to_string()
}

/// Issue 32: a 600-link `$ref` chain or 7,000 properties overflowed the
/// submitting thread's stack (a tokio worker's 2 MiB) inside llguidance and
/// aborted the server. Submitted here from a thread with that stack: past the
/// limits they are refused naming the limit, and the largest schemas within
/// them compile (on the compile threads) and run.
fn schemas_at_and_past_the_limits_neither_crash_nor_stall<B: Backend>(backend: Arc<B>) {
    use switchyard_engine::structured::limits::{MAX_PROPERTIES, MAX_REF_CHAIN};
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(engine(backend, dir.path()));
    let on_small_stack = |request: GenerationRequest| {
        let engine = Arc::clone(&engine);
        std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || engine.submit(request))
            .unwrap()
            .join()
            .unwrap()
    };
    for (text, limit) in [
        (ref_chain(600), "$ref chain length"),
        (ref_chain(3_000), "$ref chain length"),
        (wide_object(7_000, true), "object properties"),
        // Within the limits, but the parser cannot follow it past `{`: it
        // failed at the second token with a 500 error event; now a 400.
        (wide_object(MAX_PROPERTIES, false), "items"),
    ] {
        match on_small_stack(request(schema(&text), Vec::new(), 0)).map(drop) {
            Err(BackendError::InvalidRequest { param, message }) => {
                assert_eq!(param, "response_format.json_schema.schema");
                assert!(message.contains(limit), "{message}");
            }
            other => panic!("{limit}: {other:?}"),
        }
    }
    for text in [
        ref_chain(MAX_REF_CHAIN - 1),
        wide_object(MAX_PROPERTIES, true),
    ] {
        let mut accepted = request(schema(&text), Vec::new(), 0);
        accepted.max_tokens = Some(2);
        let mut stream = on_small_stack(accepted).expect("accepted");
        // It runs: tokens, then `Done` (not the engine's failure).
        loop {
            match stream.blocking_recv() {
                Some(GenerationEvent::Done { .. }) => break,
                Some(GenerationEvent::Token(_)) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    // Compiled once each, kept for the next request with the same schema.
    let checkpoint = engine.registry().resolve("tiny").unwrap();
    let kept = checkpoint.grammar_vocab.compiled().len();
    let mut again = request(schema(&wide_object(MAX_PROPERTIES, true)), Vec::new(), 1);
    again.max_tokens = Some(2);
    assert!(on_small_stack(again).is_ok());
    assert_eq!(checkpoint.grammar_vocab.compiled().len(), kept);
}

on_each_device!(
    schemas_at_and_past_the_limits_neither_crash_nor_stall,
    threads = 1
);
