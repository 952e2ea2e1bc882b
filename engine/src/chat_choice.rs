//! Which chat template a checkpoint is served with, and why.
//!
//! In order: the operator's choice (`--chat-template` or `model.toml`'s
//! `chat_template`, a known template's name or a Jinja file), then the
//! checkpoint's own template (GGUF `tokenizer.chat_template`,
//! `tokenizer_config.json`), then its family's (Gemma's for Gemma files
//! that ship none, as the 270M GGUF does), then ChatML. The origin is kept
//! so startup can say which template each model uses and why: a silent
//! ChatML fallback on a Gemma file made it answer in template markers.

use std::fmt;
use std::path::PathBuf;

use crate::chat::{ChatError, ChatTemplate, DEFAULT_CHATML_TEMPLATE};
use crate::model::config::Architecture;
use crate::tokenizer::Tokenizer;

/// Gemma's turns as llama.cpp's built-in `gemma` template writes them: BOS,
/// a system message folded into the first user turn, `assistant` called
/// `model`, contents trimmed.
const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages and messages[0]['role'] == 'system' -%}\
{%- set prefix = (messages[0]['content'] | trim) + '\\n\\n' -%}\
{%- set turns = messages[1:] -%}\
{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}\
{%- for message in turns -%}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\
{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first and role != 'model' else '') }}\
{{- message['content'] | trim }}{{ '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

/// Templates known by name, for `--chat-template NAME`.
const KNOWN: &[(&str, &str)] = &[
    ("chatml", DEFAULT_CHATML_TEMPLATE),
    ("gemma", GEMMA_TEMPLATE),
];

/// The names `--chat-template` accepts besides a file.
pub fn known_template_names() -> Vec<&'static str> {
    KNOWN.iter().map(|(name, _)| *name).collect()
}

fn known(name: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(known, _)| known.eq_ignore_ascii_case(name))
        .map(|(_, source)| *source)
}

/// An operator's template choice: a known name or a Jinja file, and where
/// it was given (`--chat-template`, a `model.toml` path) for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateSpec {
    pub value: String,
    pub given_in: String,
}

impl TemplateSpec {
    pub fn new(value: impl Into<String>, given_in: impl Into<String>) -> Self {
        TemplateSpec {
            value: value.into(),
            given_in: given_in.into(),
        }
    }

    /// The template's Jinja source: a known template or the file's text.
    pub fn source(&self) -> Result<String, ChatError> {
        if let Some(source) = known(&self.value) {
            return Ok(source.to_string());
        }
        let path = PathBuf::from(&self.value);
        std::fs::read_to_string(&path).map_err(|e| ChatError::Choice {
            reason: format!(
                "{}: chat template `{}` is neither a known template ({}) nor a readable file ({e})",
                self.given_in,
                self.value,
                known_template_names().join(", ")
            ),
        })
    }
}

/// Where a served template came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// Given by the operator.
    Operator(TemplateSpec),
    /// The checkpoint's own.
    Checkpoint,
    /// The built-in template of the checkpoint's family; it ships none.
    Family {
        name: &'static str,
        architecture: &'static str,
    },
    /// ChatML: no template in the file and none known for its family.
    Fallback { architecture: &'static str },
    /// Handed over ready-made (tests, single-model tools).
    Given,
}

impl fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateOrigin::Operator(spec) => write!(f, "`{}` from {}", spec.value, spec.given_in),
            TemplateOrigin::Checkpoint => f.write_str("the checkpoint's own"),
            TemplateOrigin::Family { name, architecture } => write!(
                f,
                "built-in `{name}`: the file has no chat template and its architecture is {architecture}"
            ),
            TemplateOrigin::Fallback { architecture } => write!(
                f,
                "built-in `chatml`: the file has no chat template and none is known for {architecture}; \
                 give one with --chat-template or model.toml's chat_template"
            ),
            TemplateOrigin::Given => f.write_str("given by the caller"),
        }
    }
}

/// The template to serve a checkpoint with, and its origin.
pub fn choose(
    spec: Option<&TemplateSpec>,
    tokenizer: &Tokenizer,
    architecture: Option<Architecture>,
) -> Result<(ChatTemplate, TemplateOrigin), ChatError> {
    if let Some(spec) = spec {
        let template = ChatTemplate::new(&spec.source()?).map_err(|e| ChatError::Choice {
            reason: format!("{}: chat template `{}`: {e}", spec.given_in, spec.value),
        })?;
        return Ok((template, TemplateOrigin::Operator(spec.clone())));
    }
    if let Some(own) = tokenizer.chat_template() {
        return Ok((ChatTemplate::new(own)?, TemplateOrigin::Checkpoint));
    }
    // A lone tokenizer.json has no architecture.
    let architecture_name = architecture.map_or("an unknown architecture", Architecture::name);
    if architecture.is_some_and(Architecture::is_gemma) {
        let origin = TemplateOrigin::Family {
            name: "gemma",
            architecture: architecture_name,
        };
        return Ok((ChatTemplate::new(GEMMA_TEMPLATE)?, origin));
    }
    let origin = TemplateOrigin::Fallback {
        architecture: architecture_name,
    };
    Ok((ChatTemplate::new(DEFAULT_CHATML_TEMPLATE)?, origin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_seam::{ChatMessage, Role};

    #[test]
    fn gemma_folds_the_system_message_and_calls_the_assistant_model() {
        let template = ChatTemplate::new(GEMMA_TEMPLATE).unwrap();
        let messages = [
            ChatMessage::new(Role::System, " Be brief. "),
            ChatMessage::new(Role::User, "Hi"),
            ChatMessage::new(Role::Assistant, "Hello\n"),
            ChatMessage::new(Role::User, "Bye"),
        ];
        let text = template.render(&messages, true, "<bos>", "<eos>").unwrap();
        assert_eq!(
            text,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn a_spec_is_a_known_name_or_a_readable_file() {
        let spec = TemplateSpec::new("Gemma", "--chat-template");
        assert_eq!(spec.source().unwrap(), GEMMA_TEMPLATE);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jinja");
        std::fs::write(&path, "{{ messages[0]['content'] }}").unwrap();
        let spec = TemplateSpec::new(path.display().to_string(), "model.toml");
        assert_eq!(spec.source().unwrap(), "{{ messages[0]['content'] }}");
        let err = TemplateSpec::new("nope", "--chat-template")
            .source()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--chat-template") && err.contains("chatml, gemma"),
            "{err}"
        );
    }
}
