//! The one place a prompt becomes token ids: raw text, token ids checked
//! against the vocabulary, or chat messages rendered through the checkpoint's
//! chat template.

use switchyard_seam::{ChatMessage, Prompt, Tool};

use crate::chat::{ChatError, ChatTemplate};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Why a prompt has no token ids.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("{0}")]
    Chat(#[from] ChatError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocabulary { id: u32, vocab_size: usize },
    #[error("the prompt is empty after tokenization; send some text")]
    Empty,
}

/// The prompt's token ids: conversations through the chat template (see
/// [`chat_prompt`]), BOS as the model asks for raw text, ids checked against
/// the vocabulary. Never empty.
pub fn encode(
    prompt: &Prompt,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    encode_with_tools(prompt, &[], None, tokenizer, template)
}

/// [`encode`], with `tools` shown to the model in a conversation (raw text
/// and token prompts carry no tools), and the `answer_prefix` the answer already
/// starts with (a cascade's handoff) written after the prompt: after the chat
/// template's opened assistant turn, or after a raw prompt's text (tokenized
/// together, as a client sending `prompt + prefix` would have it), or tokenized
/// on its own after token ids.
pub fn encode_with_tools(
    prompt: &Prompt,
    tools: &[Tool],
    answer_prefix: Option<&str>,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    let prefix = answer_prefix.unwrap_or("");
    let ids = match prompt {
        Prompt::Chat(messages) => {
            chat_prompt_continued(messages, tools, prefix, tokenizer, template)?.1
        }
        Prompt::Text(text) if prefix.is_empty() => tokenizer.encode(text, true)?,
        Prompt::Text(text) => tokenizer.encode(&format!("{text}{prefix}"), true)?,
        Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => {
            let vocab_size = tokenizer.vocab_size();
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
                return Err(PromptError::TokenOutOfVocabulary { id, vocab_size });
            }
            let mut ids = ids.clone();
            if !prefix.is_empty() {
                ids.extend(tokenizer.encode(prefix, false)?);
            }
            ids
        }
    };
    if ids.is_empty() {
        return Err(PromptError::Empty);
    }
    Ok(ids)
}

/// A conversation's rendered template text and its prompt ids, built as llama.cpp builds them:
/// the template renders (it may write BOS itself); a BOS it wrote at the
/// start is dropped when the tokenizer adds one, and an EOS at the end when
/// the tokenizer adds one; then the text is encoded with the special tokens
/// the file asks for (`add_bos_token`). So a template without BOS on a file
/// that wants one (Gemma) still starts with BOS, and none is doubled.
pub fn chat_prompt(
    messages: &[ChatMessage],
    tools: &[Tool],
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<(String, Vec<u32>), PromptError> {
    chat_prompt_continued(messages, tools, "", tokenizer, template)
}

/// [`chat_prompt`], with `prefix` written after the opened assistant turn (the
/// answer's start, which the model continues) and encoded with the rest.
fn chat_prompt_continued(
    messages: &[ChatMessage],
    tools: &[Tool],
    prefix: &str,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<(String, Vec<u32>), PromptError> {
    let rendered = template.render_with_tools(
        messages,
        tools,
        true,
        tokenizer.bos_token(),
        tokenizer.eos_token(),
    )?;
    let mut text = rendered.as_str();
    if tokenizer.adds_bos() && !tokenizer.bos_token().is_empty() {
        text = text.strip_prefix(tokenizer.bos_token()).unwrap_or(text);
    }
    if tokenizer.adds_eos() && !tokenizer.eos_token().is_empty() {
        text = text.strip_suffix(tokenizer.eos_token()).unwrap_or(text);
    }
    let ids = if prefix.is_empty() {
        tokenizer.encode(text, true)?
    } else {
        tokenizer.encode(&format!("{text}{prefix}"), true)?
    };
    Ok((rendered, ids))
}
