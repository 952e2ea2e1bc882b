//! Turning what a user asked for into prompt token ids: plain text, or chat
//! messages rendered through the checkpoint's chat template.

use crate::chat::{ChatError, ChatMessage, ChatTemplate};
use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("chat template: {0}")]
    Chat(#[from] ChatError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
}

/// Renders `messages` with the tokenizer's chat template (ChatML when the
/// checkpoint has none), ending with the assistant's turn opened.
pub fn render_chat(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<String, PromptError> {
    let template = ChatTemplate::new_or_default(tokenizer.chat_template())?;
    Ok(template.render(messages, true, tokenizer.bos_token(), tokenizer.eos_token())?)
}

/// Token ids of a chat prompt. The template writes any BOS itself, so none is
/// added here (adding one would double it).
pub fn encode_chat(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
) -> Result<Vec<u32>, PromptError> {
    let text = render_chat(tokenizer, messages)?;
    Ok(tokenizer.encode(&text, false)?)
}

/// Token ids of a plain-text prompt, with BOS when the model wants one.
pub fn encode_text(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, PromptError> {
    Ok(tokenizer.encode(text, true)?)
}
