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

mod cache;
mod grammar;
pub mod limits;
mod mask;
mod pool;
mod vocab;

pub use cache::GrammarCache;
pub use grammar::{grammar, GrammarError};
pub use mask::{mask_rows, TokenMask};
pub use vocab::{byte_factory, GrammarVocab};

use std::sync::Arc;

use llguidance::{Matcher, ParserFactory};
use switchyard_seam::{BackendError, Constraint, Tool};

use crate::tokenizer::Tokenizer;

/// The mask that enforces `constraint` on `tokenizer`'s vocabulary, or a 400
/// naming the field at fault (a limit of [`limits`] included).
///
/// Blocks until the grammar is compiled on a compile thread (see
/// [`pool`]): call it off the async runtime. A grammar compiled before over
/// this vocabulary (the same schema and tools) is reused from its cache.
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
    let eos = factory.tok_env().tok_trie().eos_token();
    let stop_ids = tokenizer.eos_ids();
    let cache = vocab.compiled();
    let key = cache.key(&top);
    if let Some(compiled) = cache.get(key) {
        return compiled.map(|matcher| TokenMask::new(matcher, eos, stop_ids));
    }
    let compiled = compile_on_pool(factory, top, constraint, tools);
    cache.insert(key, &compiled);
    compiled.map(|matcher| TokenMask::new(matcher, eos, stop_ids))
}

/// Checks `constraint` against the limits and compiles it over `factory`
/// (see [`byte_factory`]) as [`compile`] does, without a cache: what the
/// `structured_schema` fuzz target runs.
pub fn check_and_compile(
    factory: &Arc<ParserFactory>,
    constraint: &Constraint,
    tools: &[Tool],
) -> Result<(), BackendError> {
    let top = grammar(constraint, tools)
        .map_err(|error| BackendError::invalid(&error.field, error.message))?;
    compile_on_pool(factory, top, constraint, tools).map(drop)
}

/// Compiles `top` on a compile thread (see [`pool`]), blocking until it is done.
fn compile_on_pool(
    factory: &Arc<ParserFactory>,
    top: llguidance::api::TopLevelGrammar,
    constraint: &Constraint,
    tools: &[Tool],
) -> Result<Matcher, BackendError> {
    let job = {
        let (factory, constraint, tools) =
            (Arc::clone(factory), constraint.clone(), tools.to_vec());
        move || compile_matcher(&factory, top, &constraint, &tools)
    };
    pool::run(job).unwrap_or_else(|reason| Err(BackendError::invalid(constraint.field(), reason)))
}

/// Compiles `top` (the grammar of `constraint`); on a compile thread.
fn compile_matcher(
    factory: &ParserFactory,
    top: llguidance::api::TopLevelGrammar,
    constraint: &Constraint,
    tools: &[Tool],
) -> Result<Matcher, BackendError> {
    TokenMask::compile(factory, top).map_err(|message| match constraint {
        // The combined grammar failed; find the tool whose schema did.
        Constraint::ToolCalls { .. } => {
            blame_tool(factory, tools).unwrap_or_else(|| BackendError::invalid("tools", message))
        }
        other => BackendError::invalid(other.field(), message),
    })
}

/// The first tool whose arguments schema does not compile on its own.
fn blame_tool(factory: &ParserFactory, tools: &[Tool]) -> Option<BackendError> {
    tools.iter().enumerate().find_map(|(i, tool)| {
        let alone = Constraint::ToolCalls {
            names: vec![tool.name.clone()],
            parallel: false,
        };
        let top = grammar(&alone, std::slice::from_ref(tool)).ok()?;
        TokenMask::compile(factory, top).err().map(|message| {
            BackendError::invalid(&format!("tools[{i}].function.parameters"), message)
        })
    })
}
