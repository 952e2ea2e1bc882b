//! Token ids of a multiple-choice item, split as lm-evaluation-harness
//! splits them, so that scores are comparable with its numbers.
//!
//! Trailing whitespace of the context moves to the start of each choice;
//! the context is encoded alone (with BOS when the model asks for it), the
//! continuation is what encoding context + choice adds beyond the
//! context's token count. An empty context becomes BOS (EOS without one),
//! as the harness uses its end-of-text token.

use crate::tokenizer::Tokenizer;

use super::EvalError;

/// A multiple-choice item as token ids: one context, each choice's continuation.
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceTokens {
    pub context: Vec<u32>,
    pub choices: Vec<Vec<u32>>,
}

impl ChoiceTokens {
    /// Positions a sequence of the context and its longest choice takes.
    pub fn capacity(&self) -> usize {
        self.context.len() + self.choices.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Tokens a scoring pass feeds: the context once, each choice but its last token.
    pub fn fed_tokens(&self) -> usize {
        self.context.len()
            + self
                .choices
                .iter()
                .map(|c| c.len().saturating_sub(1))
                .sum::<usize>()
    }
}

/// `context` and `choices` as token ids (see the module documentation);
/// `line` names the item in errors.
pub fn encode_choices(
    tokenizer: &Tokenizer,
    context: &str,
    choices: &[String],
    line: usize,
) -> Result<ChoiceTokens, EvalError> {
    let trimmed = context.trim_end();
    let moved = &context[trimmed.len()..];
    let context_ids = if trimmed.is_empty() {
        let start = tokenizer
            .bos_id()
            .or_else(|| tokenizer.eos_ids().first().copied())
            .ok_or_else(|| EvalError::Encode {
                line,
                reason: "the context is empty and the vocabulary has no BOS or EOS to start from"
                    .into(),
            })?;
        vec![start]
    } else {
        tokenizer.encode(trimmed, true)?
    };
    let mut encoded = Vec::with_capacity(choices.len());
    for (i, choice) in choices.iter().enumerate() {
        let continuation = format!("{moved}{choice}");
        let ids = if trimmed.is_empty() {
            tokenizer.encode(&continuation, false)?
        } else {
            let whole = tokenizer.encode(&format!("{trimmed}{continuation}"), true)?;
            whole.get(context_ids.len()..).unwrap_or_default().to_vec()
        };
        if ids.is_empty() {
            return Err(EvalError::Encode {
                line,
                reason: format!("choice {i} ({choice:?}) adds no tokens to the context"),
            });
        }
        encoded.push(ids);
    }
    Ok(ChoiceTokens {
        context: context_ids,
        choices: encoded,
    })
}
