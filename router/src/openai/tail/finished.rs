//! A generation read to its end ([`Finished`]): what a whole answer, a cascade's judge
//! and a handoff read.

use crate::openai::tail::choice::Choice;
use switchyard_seam::{
    BackendError, FinishReason, GeneratedToken, GenerationEvent, TokenConfidence, Usage,
};

/// A generation that ran to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The choice's index.
    pub index: u32,
    /// The whole generated text.
    pub text: String,
    /// Every token, for log-probabilities.
    pub tokens: Vec<GeneratedToken>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Its token counts.
    pub usage: Usage,
    /// How sure the engine was of its tokens, when it measured that.
    pub confidence: Option<TokenConfidence>,
}

/// Waits for one choice to finish.
pub async fn finish(choice: Choice) -> Result<Finished, BackendError> {
    finish_after(choice, None).await
}

/// Waits for one choice to finish whose first event, `head`, was already read.
pub async fn finish_after(
    mut choice: Choice,
    mut head: Option<GenerationEvent>,
) -> Result<Finished, BackendError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        let event = match head.take() {
            Some(event) => event,
            None => choice.next_event().await,
        };
        match event {
            GenerationEvent::Token(token) => {
                text.push_str(&token.text);
                tokens.push(token);
            }
            GenerationEvent::Done {
                finish_reason,
                usage,
                confidence,
            } => {
                return Ok(Finished {
                    index: choice.index,
                    text,
                    tokens,
                    finish_reason,
                    usage,
                    confidence,
                })
            }
            GenerationEvent::Error(err) => return Err(err),
        }
    }
}

/// Waits for every choice, concurrently. The first failure drops (cancels) the rest.
pub async fn finish_all(choices: Vec<Choice>) -> Result<Vec<Finished>, BackendError> {
    futures_util::future::try_join_all(choices.into_iter().map(finish)).await
}
