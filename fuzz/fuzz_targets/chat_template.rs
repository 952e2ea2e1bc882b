//! Chat-template input: arbitrary conversations rendered through the templates the
//! server ships and a Llama-3-style one, and arbitrary text compiled as a template
//! (checkpoints carry their own). Errors are fine; panics are not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_engine::chat::{ChatMessage, ChatTemplate, DEFAULT_CHATML_TEMPLATE};

const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const STRICT: &str = "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\
{{ message['role'] | upper }}: {{ message['content'] }}\n{% endfor %}";

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if mode % 4 == 3 {
        // A template from a checkpoint: compiling must not panic; rendering a short
        // conversation through it must not either (loops are bounded by the input).
        if text.len() < 512 {
            if let Ok(template) = ChatTemplate::new(&text) {
                let messages = [ChatMessage::new("user", "hi")];
                let _ = template.render(&messages, true, "<s>", "</s>");
            }
        }
        return;
    }
    // Messages from a client: role and content alternate, split at NUL.
    let parts: Vec<&str> = text.split('\0').collect();
    let messages: Vec<ChatMessage> = parts
        .chunks(2)
        .map(|pair| ChatMessage::new(pair[0], pair.get(1).copied().unwrap_or("")))
        .collect();
    let source = [DEFAULT_CHATML_TEMPLATE, LLAMA3, STRICT][usize::from(mode % 3)];
    let template = ChatTemplate::new(source).expect("the shipped templates compile");
    if let Ok(rendered) = template.render(&messages, mode & 4 != 0, "<s>", "</s>") {
        // Every content appears in the prompt as given (trimmed by Llama 3's).
        for message in &messages {
            assert!(rendered.contains(message.content.trim()));
        }
    }
});
