//! Malformed requests: each gets an OpenAI-shaped error with the right status,
//! naming the field and the value.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use http::StatusCode;
use serde_json::{json, Value};
use support::{app_for, assert_error, post_json, post_raw};
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const INVALID: &str = "invalid_request_error";

fn chat_with(field: &str, value: Value) -> Value {
    let mut request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]});
    request[field] = value;
    request
}

async fn chat_error(request: Value, param: Option<&str>, mentions: &[&str]) {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &request).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, INVALID, param, mentions);
    assert!(
        fake.submitted().is_empty(),
        "a rejected request must not reach the backend"
    );
}

#[tokio::test]
async fn invalid_json_is_a_400_in_openai_shape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_raw(&app, CHAT, "{\"model\": ").await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        None,
        &["parse the JSON body"],
    );
    let reply = post_raw(&app, CHAT, "[1, 2]").await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        None,
        &["not an object"],
    );
    let reply = post_raw(&app, CHAT, "").await;
    assert_error(&reply, StatusCode::BAD_REQUEST, INVALID, None, &["empty"]);
    let reply = post_raw(&app, CHAT, "{} trailing").await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        None,
        &["trailing"],
    );
}

#[tokio::test]
async fn wrong_types_name_the_field_and_value() {
    chat_error(
        chat_with("temperature", json!("hot")),
        Some("temperature"),
        &["temperature", "\"hot\""],
    )
    .await;
    chat_error(chat_with("n", json!(1.5)), Some("n"), &["1.5"]).await;
    chat_error(
        chat_with("stream", json!("yes")),
        Some("stream"),
        &["\"yes\""],
    )
    .await;
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": 5, "content": "hi"}]});
    chat_error(
        request,
        Some("messages[0].role"),
        &["messages[0].role", "5"],
    )
    .await;
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": 42}]});
    chat_error(request, Some("messages[0].content"), &["42"]).await;
    chat_error(chat_with("stop", json!(7)), Some("stop"), &["7"]).await;
    chat_error(chat_with("stop", json!(["a", 3])), Some("stop[1]"), &["3"]).await;
}

#[tokio::test]
async fn missing_or_empty_messages() {
    chat_error(
        json!({"model": FAKE_MODEL}),
        Some("messages"),
        &["messages"],
    )
    .await;
    chat_error(
        json!({"model": FAKE_MODEL, "messages": []}),
        Some("messages"),
        &["[]", "at least one"],
    )
    .await;
    chat_error(
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        Some("model"),
        &["model"],
    )
    .await;
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user"}]});
    chat_error(
        request,
        Some("messages[0].content"),
        &["messages[0].content"],
    )
    .await;
}

#[tokio::test]
async fn bad_role_and_content_parts() {
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "function", "content": "b"}]});
    chat_error(
        request,
        Some("messages[1].role"),
        &["'function'", "system, developer, user, assistant, tool"],
    )
    .await;
    // A tool result must say which call it answers.
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]});
    chat_error(request, Some("messages[1].tool_call_id"), &["tool_call_id"]).await;
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]});
    chat_error(request, Some("messages[0].content[0].type"), &["image_url"]).await;
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let mut request = chat_with("model", json!("gpt-9"));
    let reply = post_json(&app, CHAT, &request).await;
    assert_error(
        &reply,
        StatusCode::NOT_FOUND,
        INVALID,
        Some("model"),
        &["gpt-9"],
    );
    assert_eq!(reply.json()["error"]["code"], "model_not_found");
    request["stream"] = json!(true);
    let reply = post_json(&app, CHAT, &request).await;
    assert_error(
        &reply,
        StatusCode::NOT_FOUND,
        INVALID,
        Some("model"),
        &["gpt-9"],
    );
}

#[tokio::test]
async fn max_tokens_below_one_or_beyond_context() {
    chat_error(
        chat_with("max_tokens", json!(0)),
        Some("max_tokens"),
        &["0", "minimum 1"],
    )
    .await;
    chat_error(
        chat_with("max_completion_tokens", json!(-3)),
        Some("max_completion_tokens"),
        &["-3"],
    )
    .await;
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &chat_with("max_tokens", json!(1000))).await;
    // Prompt: 2 tokens; context: 64.
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("max_tokens"),
        &["64", "1000", "1002", "2 in the prompt"],
    );
    assert_eq!(reply.json()["error"]["code"], "context_length_exceeded");
}

#[tokio::test]
async fn prompt_longer_than_the_context() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let long = vec!["word"; 80].join(" ");
    let reply = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": long}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("prompt"),
        &["64", "80 in the prompt"],
    );
    let request = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": long}]});
    let reply = post_json(&app, CHAT, &request).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("messages"),
        &["81 in the prompt"],
    );
}

#[tokio::test]
async fn sampling_ranges() {
    chat_error(
        chat_with("temperature", json!(2.5)),
        Some("temperature"),
        &["2.5", "[0, 2]"],
    )
    .await;
    chat_error(
        chat_with("temperature", json!(-0.1)),
        Some("temperature"),
        &["-0.1"],
    )
    .await;
    chat_error(
        chat_with("top_p", json!(0)),
        Some("top_p"),
        &["0", "(0, 1]"],
    )
    .await;
    chat_error(chat_with("top_p", json!(1.01)), Some("top_p"), &["1.01"]).await;
    chat_error(chat_with("n", json!(0)), Some("n"), &["0", "[1, 16]"]).await;
    chat_error(chat_with("n", json!(17)), Some("n"), &["17"]).await;
    chat_error(
        chat_with("presence_penalty", json!(-2.5)),
        Some("presence_penalty"),
        &["-2.5", "[-2, 2]"],
    )
    .await;
    chat_error(
        chat_with("frequency_penalty", json!(3)),
        Some("frequency_penalty"),
        &["3"],
    )
    .await;
    chat_error(
        chat_with("logit_bias", json!({"abc": 1})),
        Some("logit_bias"),
        &["\"abc\""],
    )
    .await;
    chat_error(
        chat_with("logit_bias", json!({"5": 101})),
        Some("logit_bias.5"),
        &["101"],
    )
    .await;
}

#[tokio::test]
async fn logprobs_and_stop_limits() {
    let mut request = chat_with("logprobs", json!(true));
    request["top_logprobs"] = json!(21);
    chat_error(request, Some("top_logprobs"), &["21", "20"]).await;
    chat_error(
        chat_with("top_logprobs", json!(2)),
        Some("top_logprobs"),
        &["logprobs"],
    )
    .await;
    chat_error(
        chat_with("stop", json!(["a", "b", "c", "d", "e"])),
        Some("stop"),
        &["5 stop strings", "at most 4"],
    )
    .await;
    chat_error(
        chat_with("stop", json!(["a", ""])),
        Some("stop[1]"),
        &["empty"],
    )
    .await;
    chat_error(
        chat_with("stream_options", json!({"include_usage": true})),
        Some("stream_options"),
        &["stream"],
    )
    .await;
}

#[tokio::test]
async fn completions_prompt_shapes() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let cases = [
        (json!({"model": FAKE_MODEL}), "prompt", "prompt"),
        (json!({"model": FAKE_MODEL, "prompt": []}), "prompt", "[]"),
        (
            json!({"model": FAKE_MODEL, "prompt": [1, -2]}),
            "prompt[1]",
            "-2",
        ),
        (
            json!({"model": FAKE_MODEL, "prompt": [[1], []]}),
            "prompt[1]",
            "[]",
        ),
        (
            json!({"model": FAKE_MODEL, "prompt": ["a", true]}),
            "prompt[1]",
            "true",
        ),
        (json!({"model": FAKE_MODEL, "prompt": 12}), "prompt", "12"),
        (
            json!({"model": FAKE_MODEL, "prompt": "x", "logprobs": 21}),
            "logprobs",
            "21",
        ),
        (
            json!({"model": FAKE_MODEL, "prompt": "x", "echo": true}),
            "echo",
            "echo",
        ),
        (
            json!({"model": FAKE_MODEL, "prompt": "x", "best_of": 3}),
            "best_of",
            "3",
        ),
    ];
    for (request, param, mention) in cases {
        let reply = post_json(&app, COMPLETIONS, &request).await;
        assert_error(
            &reply,
            StatusCode::BAD_REQUEST,
            INVALID,
            Some(param),
            &[mention],
        );
    }
    assert!(fake.submitted().is_empty());
}

#[tokio::test]
async fn fan_out_is_bounded() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let prompts: Vec<_> = (0..10).map(|i| format!("p{i}")).collect();
    let request = json!({"model": FAKE_MODEL, "prompt": prompts, "n": 8});
    let reply = post_json(&app, COMPLETIONS, &request).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("n"),
        &["80 generations", "64"],
    );
}

#[tokio::test]
async fn backend_overload_is_503_with_retry_after() {
    let fake = FakeBackend::default();
    fake.set_overloaded(true);
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &chat_with("n", json!(1))).await;
    assert_error(
        &reply,
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        None,
        &["overloaded"],
    );
    assert_eq!(reply.headers["retry-after"], "1");
}
