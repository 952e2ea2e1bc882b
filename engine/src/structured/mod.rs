//! Constrained decoding: the output follows a grammar because, at every step,
//! the tokens the grammar forbids get a logit of minus infinity before
//! sampling.
//!
//! The grammar engine is `llguidance` (the one llama.cpp and vLLM use), so
//! this module only translates: a checkpoint's vocabulary into llguidance's
//! token trie ([`GrammarVocab`], built once per checkpoint), the seam's
//! [`switchyard_seam::Constraint`] into a grammar ([`grammar`]), and each
//! step's mask onto a row of logits ([`TokenMask`]).
//!
//! A grammar is compiled when the request is prepared, before it is queued,
//! so a schema llguidance cannot enforce is refused with a 400 that names
//! the field and the keyword, and nothing reaches the executor.

mod grammar;
mod mask;
mod vocab;

pub use grammar::{grammar, GrammarError};
pub use mask::{mask_rows, TokenMask};
pub use vocab::GrammarVocab;

use switchyard_seam::{BackendError, Constraint, Tool};

use crate::tokenizer::Tokenizer;

/// The mask that enforces `constraint` on `tokenizer`'s vocabulary, or a 400
/// naming the field at fault.
pub fn compile(
    vocab: &GrammarVocab,
    tokenizer: &Tokenizer,
    constraint: &Constraint,
    tools: &[Tool],
) -> Result<TokenMask, BackendError> {
    let factory = vocab
        .factory(tokenizer)
        .map_err(|reason| BackendError::invalid(constraint.field(), reason))?;
    let top = grammar(constraint, tools)
        .map_err(|error| BackendError::invalid(&error.field, error.message))?;
    match TokenMask::new(factory, top, tokenizer.eos_ids()) {
        Ok(mask) => Ok(mask),
        // The combined grammar failed; find the tool whose schema did.
        Err(message) => Err(match constraint {
            Constraint::ToolCalls { .. } => blame_tool(factory, tools)
                .unwrap_or_else(|| BackendError::invalid("tools", message)),
            other => BackendError::invalid(other.field(), message),
        }),
    }
}

/// The first tool whose arguments schema does not compile on its own.
fn blame_tool(factory: &llguidance::ParserFactory, tools: &[Tool]) -> Option<BackendError> {
    tools.iter().enumerate().find_map(|(i, tool)| {
        let alone = Constraint::ToolCalls {
            names: vec![tool.name.clone()],
            parallel: false,
        };
        let top = grammar(&alone, std::slice::from_ref(tool)).ok()?;
        TokenMask::new(factory, top, &[]).err().map(|message| {
            BackendError::invalid(&format!("tools[{i}].function.parameters"), message)
        })
    })
}
