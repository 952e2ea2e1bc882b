//! `POST /v1/completions`, whole and streamed, against the fake backend.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use serde_json::json;
use support::{app_for, post_json};
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_seam::Prompt;

const COMPLETIONS: &str = "/v1/completions";

#[tokio::test]
async fn whole_response_has_openai_shape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": "once upon", "max_tokens": 4}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(body["model"], FAKE_MODEL);
    assert_eq!(
        body["choices"],
        json!([{"text": "The quick brown fox", "index": 0, "logprobs": null, "finish_reason": "length"}])
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(fake.submitted()[0].prompt, Prompt::Text("once upon".into()));
}

#[tokio::test]
async fn max_tokens_defaults_to_openai_16() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let body = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": "x"}),
    )
    .await
    .json();
    assert_eq!(fake.submitted()[0].max_tokens, Some(16));
    // The 9-word reply ends before 16 tokens: a natural stop.
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn several_prompts_times_n_are_indexed_prompt_major() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let request =
        json!({"model": FAKE_MODEL, "prompt": ["a", "b c"], "n": 2, "max_tokens": 1, "seed": 5});
    let body = post_json(&app, COMPLETIONS, &request).await.json();
    assert_eq!(body["choices"].as_array().unwrap().len(), 4);
    let prompts: Vec<_> = fake
        .submitted()
        .into_iter()
        .map(|r| (r.prompt, r.sampling.seed))
        .collect();
    assert_eq!(
        prompts,
        vec![
            (Prompt::Text("a".into()), Some(5)),
            (Prompt::Text("a".into()), Some(6)),
            (Prompt::Text("b c".into()), Some(5)),
            (Prompt::Text("b c".into()), Some(6)),
        ]
    );
    // Each prompt counted once: 1 + 2 words.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn token_prompts_are_passed_as_tokens() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": [1, 2, 3]}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let reply = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": [[4], [5, 6]]}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let prompts: Vec<_> = fake.submitted().into_iter().map(|r| r.prompt).collect();
    assert_eq!(
        prompts,
        vec![
            Prompt::Tokens(vec![1, 2, 3]),
            Prompt::Tokens(vec![4]),
            Prompt::Tokens(vec![5, 6])
        ]
    );
}

#[tokio::test]
async fn logprobs_have_legacy_shape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let body = post_json(
        &app,
        COMPLETIONS,
        &json!({"model": FAKE_MODEL, "prompt": "x", "max_tokens": 2, "logprobs": 1}),
    )
    .await
    .json();
    let logprobs = &body["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["The", " quick"]));
    assert_eq!(logprobs["text_offset"], json!([0, 3]));
    assert_eq!(logprobs["token_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(logprobs["top_logprobs"][1].as_object().unwrap().len(), 1);
    assert!(logprobs["top_logprobs"][1].get(" quick").is_some());
}

#[tokio::test]
async fn stream_sends_text_chunks_then_done() {
    let fake = FakeBackend::builder().reply("one two three").build();
    let (app, _) = app_for(&fake);
    let request = json!({
        "model": FAKE_MODEL, "prompt": "count", "stream": true, "stop": ["three"],
        "stream_options": {"include_usage": true}
    });
    let reply = post_json(&app, COMPLETIONS, &request).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.sse_data().last().unwrap(), "[DONE]");
    let chunks = reply.sse_json();
    let texts: Vec<_> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, vec!["one", " two", ""]);
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "text_completion");
    }
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(
        chunks[3]["usage"],
        json!({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(fake.submitted()[0].stop, vec!["three".to_owned()]);
}
