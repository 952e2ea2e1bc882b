//! Arbitrary bytes as the body of `POST /v1/chat/completions` and
//! `POST /v1/completions`: decoding and validation must accept or refuse with an
//! OpenAI-shaped error, never panic, and an accepted request must fan out into a
//! bounded number of generations.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_router::openai::chat::ValidatedChatRequest;
use switchyard_router::openai::completions::ValidatedCompletionRequest;
use switchyard_router::openai::extract::parse_json_object;
use switchyard_router::openai::generate::check_fanout;
use switchyard_router::openai::types::{ChatCompletionRequest, CompletionRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(wire) = parse_json_object::<ChatCompletionRequest>(data) {
        let n = wire.n;
        if let Ok(valid) = ValidatedChatRequest::try_from(wire) {
            assert!(check_fanout(1, n, 64).is_ok());
            let requests = valid.params.requests("fuzz", &valid.model, Vec::new());
            assert!(requests.is_empty());
        }
    }
    if let Ok(wire) = parse_json_object::<CompletionRequest>(data) {
        let n = wire.n;
        if let Ok(valid) = ValidatedCompletionRequest::try_from(wire) {
            let prompts = valid.prompts.len();
            if check_fanout(prompts, n, 64).is_ok() {
                let requests = valid.params.requests("fuzz", &valid.model, valid.prompts);
                assert_eq!(requests.len(), prompts * valid.params.n as usize);
                assert!(requests.len() <= 64);
            }
        }
    }
    // An error always renders as an OpenAI error body.
    if let Err(error) = parse_json_object::<ChatCompletionRequest>(data) {
        let body = serde_json::to_string(&error.body()).expect("error bodies serialize");
        assert!(body.starts_with("{\"error\":"));
    }
});
