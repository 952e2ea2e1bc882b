//! Black-box test of `switchyard serve` with the `async-openai` client on the
//! real SmolLM2 model: a chat completion and a streamed completion.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "../engine/tests/support/real_models.rs"]
mod real_models;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::types::{
    ChatCompletionRequestSystemMessageArgs, ChatCompletionRequestUserMessageArgs,
    CompletionFinishReason, CreateChatCompletionRequestArgs, CreateCompletionRequestArgs,
};
use async_openai::Client;
use futures_util::StreamExt;

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_server(model: &PathBuf) -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["serve", "--model"])
        .arg(model)
        .args(["--model-name", "smollm2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/ready")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the server did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (server, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_streamed_completion_through_async_openai() {
    let (_server, base) = start_server(&real_models::smollm2()).await;
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("{base}/v1"))
            .with_api_key("unused"),
    );

    let models = client.models().list().await.unwrap();
    // The model by name (its active version), then its resident version.
    let ids: Vec<&str> = models.data.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["smollm2", "smollm2@1"]);

    let request = CreateChatCompletionRequestArgs::default()
        .model("smollm2")
        .messages([
            ChatCompletionRequestSystemMessageArgs::default()
                .content("You are a helpful assistant.")
                .build()
                .unwrap()
                .into(),
            ChatCompletionRequestUserMessageArgs::default()
                .content("What is the capital of France? Answer in one sentence.")
                .build()
                .unwrap()
                .into(),
        ])
        .max_completion_tokens(24u32)
        .temperature(0.0)
        .build()
        .unwrap();
    let reply = client.chat().create(request).await.unwrap();
    let content = reply.choices[0].message.content.clone().unwrap();
    assert!(content.contains("Paris"), "{content}");
    let usage = reply.usage.unwrap();
    assert!(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    assert!(usage.completion_tokens <= 24);

    let request = CreateCompletionRequestArgs::default()
        .model("smollm2")
        .prompt("Once upon a time")
        .max_tokens(12u32)
        .temperature(0.0)
        .build()
        .unwrap();
    let whole = client.completions().create(request.clone()).await.unwrap();
    let mut stream = client.completions().create_stream(request).await.unwrap();
    let mut text = String::new();
    let mut finish = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        for choice in chunk.choices {
            text.push_str(&choice.text);
            finish = choice.finish_reason.or(finish);
        }
    }
    assert!(!text.is_empty());
    assert_eq!(text, whole.choices[0].text);
    assert!(matches!(
        finish,
        Some(CompletionFinishReason::Length) | Some(CompletionFinishReason::Stop)
    ));
}
