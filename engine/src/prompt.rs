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

/// The prompt's token ids: chat template for conversations (the template
/// writes any BOS itself, so none is added), BOS as the model asks for raw
/// text, ids checked against the vocabulary. Never empty.
pub fn encode(
    prompt: &Prompt,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    encode_with_tools(prompt, &[], tokenizer, template)
}

/// [`encode`], with `tools` shown to the model in a conversation (raw text
/// and token prompts carry no tools).
pub fn encode_with_tools(
    prompt: &Prompt,
    tools: &[Tool],
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Vec<u32>, PromptError> {
    let ids = match prompt {
        Prompt::Chat(messages) => {
            let text = template.render_with_tools(
                messages,
                tools,
                true,
                tokenizer.bos_token(),
                tokenizer.eos_token(),
            )?;
            tokenizer.encode(&text, false)?
        }
        Prompt::Text(text) => tokenizer.encode(text, true)?,
        Prompt::Tokens(ids) | Prompt::Encoded { ids, .. } => {
            let vocab_size = tokenizer.vocab_size();
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
                return Err(PromptError::TokenOutOfVocabulary { id, vocab_size });
            }
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(PromptError::Empty);
    }
    Ok(ids)
}

/// The text a conversation's ids come from: `messages` rendered through `template`,
/// ending where the assistant's reply begins.
pub fn chat_text(
    messages: &[ChatMessage],
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<String, ChatError> {
    template.render(messages, true, tokenizer.bos_token(), tokenizer.eos_token())
}
