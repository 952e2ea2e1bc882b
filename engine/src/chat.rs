//! Chat templates (`tokenizer.chat_template`) rendered with minijinja.
//!
//! Checkpoints ship Jinja templates written for Python's jinja2 as
//! transformers runs it: `trim_blocks` and `lstrip_blocks` on, Python string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`) available, and
//! a `raise_exception(msg)` global. The same environment is set up here so
//! templates render byte for byte as they do in transformers.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;
use switchyard_seam::{ChatMessage, Role, Tool};

use crate::chat_tools;

/// ChatML, for checkpoints that ship no template.
pub const DEFAULT_CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// One message as a template reads it: `message['role']`, `message['content']`,
/// and for tool-calling templates `message['tool_calls']`, `message['tool_call_id']`
/// (left out when empty, as templates test them with `is defined`).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

impl<'a> TemplateMessage<'a> {
    fn of(message: &'a ChatMessage) -> Self {
        // Templates know `system`; OpenAI's `developer` plays that part.
        let role = match message.role {
            Role::Developer => Role::System,
            other => other,
        };
        TemplateMessage {
            role: role.as_str(),
            content: &message.content,
            tool_calls: message
                .tool_calls
                .iter()
                .map(chat_tools::tool_call_value)
                .collect(),
            tool_call_id: message.tool_call_id.as_deref(),
        }
    }
}

/// A chat template failure.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the chat template does not parse: {reason}; fix the checkpoint's chat_template or supply another")]
    Syntax { reason: String },

    #[error("the chat template refused the conversation: {message}")]
    Raised { message: String },

    #[error("rendering the chat template failed: {reason}")]
    Render { reason: String },

    /// The operator's `--chat-template` / `chat_template` cannot be used.
    #[error("{reason}")]
    Choice { reason: String },
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether the template renders tools and tool calls itself (it reads
    /// `tool_calls`); otherwise [`chat_tools::hermes_conversation`] does.
    native_tools: bool,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        // jinja2 as transformers configures it.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Syntax {
                reason: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            native_tools: source.contains("tool_calls"),
        })
    }

    /// The checkpoint's template, or ChatML when it has none.
    pub fn new_or_default(source: Option<&str>) -> Result<ChatTemplate, ChatError> {
        ChatTemplate::new(source.unwrap_or(DEFAULT_CHATML_TEMPLATE))
    }

    /// Renders `messages` to the prompt text. With `add_generation_prompt`,
    /// the text ends where the assistant's reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, &[], add_generation_prompt, bos_token, eos_token)
    }

    /// [`ChatTemplate::render`] with `tools` the model may call, and tool
    /// calls and results in the conversation, shown the template's way or,
    /// for a template without tools, the Hermes way.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, ChatError> {
        let uses_tools = !tools.is_empty()
            || messages
                .iter()
                .any(|m| m.role == Role::Tool || !m.tool_calls.is_empty());
        let rewritten;
        let (messages, tools_value) = if self.native_tools || !uses_tools {
            let listed = (!tools.is_empty()).then(|| chat_tools::tools_value(tools));
            (messages, listed)
        } else {
            rewritten = chat_tools::hermes_conversation(messages, tools);
            (rewritten.as_slice(), None)
        };
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render {
                reason: describe(&e),
            })?;
        let messages: Vec<TemplateMessage<'_>> = messages.iter().map(TemplateMessage::of).collect();
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
            // transformers passes these as None when unused; templates test them.
            tools => match tools_value {
                Some(tools) => Value::from_serialize(&tools),
                None => Value::from(()),
            },
            documents => Value::from(()),
        };
        template
            .render(context)
            .map_err(|e| match raised_message(&e) {
                Some(message) => ChatError::Raised { message },
                None => ChatError::Render {
                    reason: describe(&e),
                },
            })
    }
}

/// Marks errors raised by the template itself, so they are told apart
/// from template bugs.
const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

fn raised_message(e: &minijinja::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(jinja) = err.downcast_ref::<minijinja::Error>() {
            if let Some(message) = jinja.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
                return Some(message.to_string());
            }
        }
        current = err.source();
    }
    None
}

/// The error with its template line, when minijinja knows it.
fn describe(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Hi"),
        ]
    }

    #[test]
    fn default_chatml_renders_the_generation_prompt() {
        let template = ChatTemplate::new_or_default(None).unwrap();
        let text = template.render(&conversation(), true, "", "").unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let text = template.render(&conversation(), false, "", "").unwrap();
        assert!(text.ends_with("Hi<|im_end|>\n"));
    }

    #[test]
    fn python_string_methods_and_tokens_are_available() {
        let source = "{{ bos_token }}{% for m in messages %}{% if m.content.startswith('B') %}{{ m.content.strip().upper() }}{% endif %}{% endfor %}{{ eos_token }}";
        let template = ChatTemplate::new(source).unwrap();
        let messages = [ChatMessage::new(Role::System, "  Be brief.  ")];
        let text = template.render(&messages, false, "<s>", "</s>").unwrap();
        assert_eq!(text, "<s></s>");
        let messages = [ChatMessage::new(Role::System, "Be brief.  ")];
        let text = template.render(&messages, false, "<s>", "</s>").unwrap();
        assert_eq!(text, "<s>BE BRIEF.</s>");
    }

    #[test]
    fn raise_exception_becomes_a_raised_error() {
        let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}";
        let template = ChatTemplate::new(source).unwrap();
        let err = template.render(&conversation(), true, "", "").unwrap_err();
        match err {
            ChatError::Raised { message } => {
                assert_eq!(message, "first message must be from the user")
            }
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_are_reported_at_compile_time() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, ChatError::Syntax { .. }), "{err:?}");
    }

    #[test]
    fn trim_and_lstrip_blocks_match_transformers() {
        let source = "{% for m in messages %}\n    {% if true %}\n{{ m.role }}\n    {% endif %}\n{% endfor %}";
        let template = ChatTemplate::new(source).unwrap();
        let text = template.render(&conversation(), false, "", "").unwrap();
        assert_eq!(text, "system\nuser\n");
    }

    #[test]
    fn tools_is_none_not_undefined() {
        let source = "{% if tools is none %}none{% else %}some{% endif %}";
        let template = ChatTemplate::new(source).unwrap();
        assert_eq!(template.render(&[], false, "", "").unwrap(), "none");
    }
}
