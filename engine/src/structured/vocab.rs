//! A checkpoint's vocabulary as llguidance reads it: the bytes of every token,
//! special tokens marked so that no grammar matches them as text.

use std::sync::{Arc, OnceLock};

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;

use super::cache::GrammarCache;
use crate::tokenizer::Tokenizer;

/// llguidance's view of one checkpoint's vocabulary, built on the first
/// constrained request (tens of milliseconds for a 50k vocabulary) and
/// shared by every later one, with the grammars compiled over it.
#[derive(Default)]
pub struct GrammarVocab {
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    compiled: GrammarCache,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("built", &self.factory.get().is_some())
            .field("compiled", &self.compiled)
            .finish()
    }
}

impl GrammarVocab {
    /// The parser factory for `tokenizer` (the checkpoint's own; the first
    /// call builds it), or why its vocabulary cannot be constrained.
    pub fn factory(&self, tokenizer: &Tokenizer) -> Result<&Arc<ParserFactory>, String> {
        match self.factory.get_or_init(|| build(tokenizer).map(Arc::new)) {
            Ok(factory) => Ok(factory),
            Err(reason) => Err(reason.clone()),
        }
    }

    /// The grammars compiled over this vocabulary.
    pub fn compiled(&self) -> &GrammarCache {
        &self.compiled
    }
}

/// A parser factory over a vocabulary of the 256 bytes and an EOS token: no
/// checkpoint needed, for fuzzing and tests of grammars. Built once.
pub fn byte_factory() -> Result<Arc<ParserFactory>, String> {
    static FACTORY: OnceLock<Result<Arc<ParserFactory>, String>> = OnceLock::new();
    FACTORY.get_or_init(build_byte_factory).clone()
}

fn build_byte_factory() -> Result<Arc<ParserFactory>, String> {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e', b'o', b's']);
    let size = u32::try_from(words.len()).map_err(|e| e.to_string())?;
    let trie = TokTrie::from(&TokRxInfo::new(size, size - 1), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    Ok(Arc::new(factory))
}

fn build(tokenizer: &Tokenizer) -> Result<ParserFactory, String> {
    let unusable = |reason: String| {
        format!("this model's tokenizer cannot be used for constrained decoding: {reason}")
    };
    let json = tokenizer
        .huggingface_json()
        .map_err(|e| unusable(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| unusable(e.to_string()))?;
    let mut words =
        llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| unusable(e.to_string()))?;
    let vocab_size = tokenizer.vocab_size();
    words.resize(vocab_size, Vec::new());
    for (id, word) in words.iter_mut().enumerate() {
        // An id with no text (a hole in the vocabulary) becomes a special
        // token no grammar can produce, as llguidance's own loaders do.
        if word.is_empty() {
            word.push(TokTrie::SPECIAL_TOKEN_MARKER);
            word.extend_from_slice(format!("[{id}]").as_bytes());
        }
    }
    let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
    let size = u32::try_from(vocab_size).map_err(|e| unusable(e.to_string()))?;
    let trie = TokTrie::from(&TokRxInfo::new(size, eos), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| unusable(e.to_string()))?;
    // Grammar warnings go back to the client as errors, not to stderr.
    factory.quiet();
    Ok(factory)
}
