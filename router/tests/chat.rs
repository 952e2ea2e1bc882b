//! `POST /v1/chat/completions`, whole and streamed, against the fake backend.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use serde_json::json;
use support::{app_for, post_json};
use switchyard_router::fake::{FakeBackend, FAKE_MODEL};
use switchyard_seam::{ChatMessage, Prompt, Role};

const CHAT: &str = "/v1/chat/completions";

fn hello() -> serde_json::Value {
    json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn whole_response_has_openai_shape_and_real_usage() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let reply = post_json(&app, CHAT, &hello()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(body["created"].as_u64().unwrap() > 0);
    assert_eq!(body["model"], FAKE_MODEL);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        choice["message"]["content"],
        "The quick brown fox jumps over the lazy dog"
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    // The fake counts one token per word plus one per message.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn max_tokens_gives_finish_reason_length() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["max_completion_tokens"] = json!(2);
    let body = post_json(&app, CHAT, &request).await.json();
    assert_eq!(body["choices"][0]["message"]["content"], "The quick");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 2);
    assert_eq!(fake.submitted()[0].max_tokens, Some(2));
}

#[tokio::test]
async fn request_fields_reach_the_backend() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let request = json!({
        "model": FAKE_MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": "really"},
            {"role": "assistant", "content": null},
            {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}
        ],
        "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "seed": 7,
        "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "logit_bias": {"42": -100, "7": 3.5}, "stop": "fox", "user": "u-1"
    });
    let reply = post_json(&app, CHAT, &request).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let submitted = &fake.submitted()[0];
    assert_eq!(
        submitted.prompt,
        Prompt::Chat(vec![
            ChatMessage::new(Role::System, "be brief"),
            ChatMessage::new(Role::Developer, "really"),
            ChatMessage::new(Role::Assistant, ""),
            ChatMessage::new(Role::User, "part one, part two"),
        ])
    );
    assert_eq!(submitted.stop, vec!["fox".to_owned()]);
    assert_eq!(submitted.max_tokens, Some(5));
    assert_eq!(submitted.sampling.temperature, Some(0.5));
    assert_eq!(submitted.sampling.top_p, Some(0.9));
    assert_eq!(submitted.sampling.seed, Some(7));
    assert_eq!(submitted.sampling.presence_penalty, 0.5);
    assert_eq!(submitted.sampling.frequency_penalty, -0.5);
    assert_eq!(submitted.sampling.logit_bias.get(&42), Some(&-100.0));
    assert_eq!(submitted.sampling.logit_bias.get(&7), Some(&3.5));
    assert_eq!(submitted.user.as_deref(), Some("u-1"));
    assert_eq!(submitted.logprobs, None);
    // The fake honours the stop string it was passed.
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["content"], "The quick brown");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn n_choices_are_separate_generations_with_successive_seeds() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["n"] = json!(3);
    request["seed"] = json!(10);
    let body = post_json(&app, CHAT, &request).await.json();
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
    }
    let seeds: Vec<_> = fake.submitted().iter().map(|r| r.sampling.seed).collect();
    assert_eq!(seeds, vec![Some(10), Some(11), Some(12)]);
    let ids: Vec<_> = fake
        .submitted()
        .iter()
        .map(|r| r.request_id.clone())
        .collect();
    assert!(ids[0].ends_with("/0") && ids[2].ends_with("/2"), "{ids:?}");
    // The prompt is counted once, completions for every choice.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 27, "total_tokens": 30, "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn logprobs_have_openai_shape() {
    let fake = FakeBackend::default();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["logprobs"] = json!(true);
    request["top_logprobs"] = json!(2);
    request["max_tokens"] = json!(2);
    let body = post_json(&app, CHAT, &request).await.json();
    assert_eq!(fake.submitted()[0].logprobs, Some(2));
    let content = &body["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().unwrap().len(), 2);
    assert_eq!(content[1]["token"], " quick");
    assert_eq!(content[1]["bytes"], json!(b" quick".to_vec()));
    assert!((content[1]["logprob"].as_f64().unwrap() + 0.2).abs() < 1e-6);
    assert_eq!(content[1]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(content[1]["top_logprobs"][1]["token"], "alt1");
}

#[tokio::test]
async fn stream_sends_role_tokens_finish_and_done() {
    let fake = FakeBackend::builder().reply("Hi there").build();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["stream"] = json!(true);
    let reply = post_json(&app, CHAT, &request).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let data = reply.sse_data();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks = reply.sse_json();
    assert_eq!(chunks.len(), 4, "{chunks:?}");
    let id = chunks[0]["id"].clone();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["model"], FAKE_MODEL);
        assert!(
            chunk.get("usage").is_none(),
            "no usage unless asked: {chunk}"
        );
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[1]["choices"][0]["delta"], json!({"content": "Hi"}));
    assert_eq!(
        chunks[2]["choices"][0]["delta"],
        json!({"content": " there"})
    );
    assert!(chunks[2]["choices"][0]["finish_reason"].is_null());
    assert_eq!(chunks[3]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn stream_include_usage_adds_a_final_usage_chunk() {
    let fake = FakeBackend::builder().reply("a b c").build();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["stream"] = json!(true);
    request["n"] = json!(2);
    request["max_tokens"] = json!(2);
    request["stream_options"] = json!({"include_usage": true});
    let reply = post_json(&app, CHAT, &request).await;
    let chunks = reply.sse_json();
    let (last, rest) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    for chunk in rest {
        assert!(
            chunk["usage"].is_null() && chunk.get("usage").is_some(),
            "{chunk}"
        );
    }
    // Both choices open, stream their tokens, and finish with "length".
    for index in 0..2 {
        let of_choice: Vec<_> = rest
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert_eq!(of_choice.len(), 4, "role, 2 tokens, finish");
        let text: String = of_choice
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "a b");
        assert_eq!(of_choice[3]["choices"][0]["finish_reason"], "length");
    }
    assert_eq!(reply.sse_data().last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn stream_logprobs_ride_on_token_chunks() {
    let fake = FakeBackend::builder().reply("x y").build();
    let (app, _) = app_for(&fake);
    let mut request = hello();
    request["stream"] = json!(true);
    request["logprobs"] = json!(true);
    let chunks = post_json(&app, CHAT, &request).await.sse_json();
    let logprobs = &chunks[1]["choices"][0]["logprobs"]["content"][0];
    assert_eq!(logprobs["token"], "x");
    assert_eq!(logprobs["top_logprobs"], json!([]));
}
