//! One function per parser a stranger can feed (see the crate documentation).

use std::collections::BTreeMap;
use std::path::Path;

use switchyard_engine::chat::{ChatTemplate, DEFAULT_CHATML_TEMPLATE};
use switchyard_engine::formats::gguf::{model_config, GgufFile};
use switchyard_engine::formats::safetensors::shard_tensors;
use switchyard_engine::model::config::Architecture;
use switchyard_policies::{route, Caller, IdleEngine, ModelHint, Policy, RouteRequest};
use switchyard_router::openai::chat::ValidatedChatRequest;
use switchyard_router::openai::completions::ValidatedCompletionRequest;
use switchyard_router::openai::params::check_fanout;
use switchyard_router::openai::parse::parse_json_object;
use switchyard_router::openai::types::{ChatCompletionRequest, CompletionRequest};
use switchyard_seam::{ChatMessage, Role};

/// GGUF files (repository models, admin loads): every tensor of a file the reader
/// accepts is readable, in bounds and of the size its type and shape imply.
pub fn gguf_reader(data: &[u8]) {
    let Ok(file) = GgufFile::parse(data) else {
        return;
    };
    for (name, info) in file.tensors() {
        let tensor = file
            .tensor_data(name)
            .expect("a tensor of a parsed file is readable");
        let elements: usize = tensor.shape.iter().product();
        assert_eq!(Some(tensor.data.len()), tensor.dtype.bytes_for(elements));
        assert_eq!(tensor.data.len(), info.size);
        // Touch every byte, as a loader would.
        let sum = tensor.data.iter().fold(0u8, |a, b| a.wrapping_add(*b));
        std::hint::black_box(sum);
    }
    let _ = std::hint::black_box(model_config(&file));
}

/// One safetensors file: refused, or tensors inside the file of the size their dtype
/// and shape imply.
pub fn safetensors_shard(data: &[u8]) {
    let bytes = bytes::Bytes::copy_from_slice(data);
    let mut tensors = BTreeMap::new();
    let path = Path::new("fuzz.safetensors");
    if shard_tensors(bytes, path, Architecture::Llama, &mut tensors).is_err() {
        return;
    }
    for tensor in tensors.values() {
        let elements = tensor
            .shape
            .iter()
            .try_fold(1usize, |a, b| a.checked_mul(*b));
        let expected = elements.and_then(|n| tensor.dtype.bytes_for(n));
        assert_eq!(expected, Some(tensor.data.len()));
    }
}

/// What every `env:VAR` API key of a fuzzed policy reads.
pub const FUZZ_KEY: &str = "fuzz-key-0123456789abcdef";

/// A routing policy file (hot-reloaded): loads or is refused with diagnostics; a policy
/// that loads routes requests without panicking.
pub fn policy_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Every `env:` key resolves, so that policies with tenants get past their keys.
    let env = |_: &str| Some(FUZZ_KEY.to_owned());
    let Ok(policy) = Policy::from_toml_str_with_env(text, "fuzz.toml", &env) else {
        return;
    };
    for model in ["auto", "m", "m@1"] {
        let mut request = RouteRequest::new(ModelHint::parse(model), Caller::Anonymous);
        request.prompt_tokens = 10;
        request.generations = 3;
        let _ = route(&policy, &request, &IdleEngine);
    }
}

/// A body of `POST /v1/chat/completions` or `/v1/completions`: accepted, or refused
/// with an OpenAI-shaped error; an accepted request fans out into at most the server's
/// limit of generations.
pub fn openai_request(data: &[u8]) {
    const MAX_FANOUT: u32 = 64;
    match parse_json_object::<ChatCompletionRequest>(data) {
        Ok(wire) => {
            let n = wire.n;
            if let Ok(valid) = ValidatedChatRequest::try_from(wire) {
                if check_fanout(1, n, MAX_FANOUT).is_ok() {
                    let prompts = vec![switchyard_seam::Prompt::Chat(valid.messages.clone())];
                    let requests = valid.params.requests(
                        "fuzz",
                        &switchyard_seam::ModelSpec::parse("fuzz@1"),
                        &switchyard_seam::CacheScope::deployment(),
                        prompts,
                    );
                    assert_eq!(requests.len(), valid.params.n as usize);
                    assert!(requests.len() <= MAX_FANOUT as usize);
                }
            }
        }
        Err(error) => {
            let body = serde_json::to_string(&error.body()).expect("error bodies serialize");
            assert!(body.starts_with("{\"error\":"), "{body}");
        }
    }
    if let Ok(wire) = parse_json_object::<CompletionRequest>(data) {
        let n = wire.n;
        if let Ok(valid) = ValidatedCompletionRequest::try_from(wire) {
            let prompts = valid.prompts.len();
            if check_fanout(prompts, n, MAX_FANOUT).is_ok() {
                let requests = valid.params.requests(
                    "fuzz",
                    &switchyard_seam::ModelSpec::parse("fuzz@1"),
                    &switchyard_seam::CacheScope::deployment(),
                    valid.prompts,
                );
                assert_eq!(requests.len(), prompts * valid.params.n as usize);
                assert!(requests.len() <= MAX_FANOUT as usize);
            }
        }
    }
}

/// A Llama-3-style template, beside the shipped ChatML, for client conversations.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// A template that raises on a role it does not know (as many checkpoints' do).
const STRICT: &str =
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\
{{ message['role'] | upper }}: {{ message['content'] }}\n{% endfor %}";

/// Chat-template input. The first byte picks the mode: a conversation from a client
/// (roles and contents split at NUL) through a known template, whose every content
/// must appear in the prompt; or (mode 3) text compiled as a checkpoint's template,
/// which must compile or be refused, and render a short conversation or be refused.
pub fn chat_template(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if mode % 4 == 3 {
        // Bounded: minijinja's own limits keep loops finite, but a long random template
        // is mostly slow, not interesting.
        if text.len() < 512 {
            if let Ok(template) = ChatTemplate::new(&text) {
                let messages = [ChatMessage::new(Role::User, "hi")];
                let _ = template.render(&messages, true, "<s>", "</s>");
            }
        }
        return;
    }
    let parts: Vec<&str> = text.split('\0').collect();
    let messages: Vec<ChatMessage> = parts
        .chunks(2)
        .map(|pair| {
            let role = Role::parse(pair[0]).unwrap_or(Role::User);
            ChatMessage::new(role, pair.get(1).copied().unwrap_or(""))
        })
        .collect();
    let source = [DEFAULT_CHATML_TEMPLATE, LLAMA3, STRICT][usize::from(mode % 3)];
    let template = ChatTemplate::new(source).expect("the shipped templates compile");
    if let Ok(rendered) = template.render(&messages, mode & 4 != 0, "<s>", "</s>") {
        for message in &messages {
            assert!(
                rendered.contains(message.content.trim()),
                "{:?} is missing from the prompt",
                message.content
            );
        }
    }
}

/// A schema a client sends as `response_format` or as a forced tool's parameters
/// (the input is its JSON text): checked against the limits and compiled on the
/// compile threads. The process survives whatever the schema (a stack overflow in
/// the grammar engine aborted the server), and every refusal names the field the
/// schema came in.
pub fn structured_schema(data: &[u8]) {
    use switchyard_engine::structured::{byte_factory, check_and_compile};
    use switchyard_seam::{BackendError, Constraint, Tool};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(factory) = byte_factory() else {
        panic!("the byte vocabulary builds");
    };
    let field = "response_format.json_schema.schema";
    let as_format = Constraint::JsonSchema {
        schema: text.to_owned(),
        field: field.to_owned(),
    };
    let tool = |name: &str| Tool {
        name: name.to_owned(),
        description: None,
        parameters: text.to_owned(),
    };
    // Twice, so that the request's shared property and node budget is exercised.
    let as_tools = Constraint::ToolCalls {
        names: vec!["a".to_owned(), "b".to_owned()],
        parallel: true,
    };
    for (constraint, tools, fields) in [
        (as_format, Vec::new(), vec![field.to_owned()]),
        (
            as_tools,
            vec![tool("a"), tool("b")],
            vec![
                "tools".to_owned(),
                "tools[0].function.parameters".to_owned(),
                "tools[1].function.parameters".to_owned(),
            ],
        ),
    ] {
        match check_and_compile(&factory, &constraint, &tools) {
            Ok(()) => {}
            Err(BackendError::InvalidRequest { param, .. }) => {
                assert!(fields.contains(&param), "refusal names {param}");
            }
            Err(other) => panic!("a schema is refused as a bad request, not {other:?}"),
        }
    }
}
