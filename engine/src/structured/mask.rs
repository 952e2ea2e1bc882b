//! One sequence's grammar state: which tokens may come next, and the step
//! that moves it on.

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

/// A compiled grammar following one sequence's output.
pub struct TokenMask {
    matcher: Matcher,
    /// Ids that end generation (EOS, end of turn); allowed whenever the
    /// grammar could end, since llguidance knows only one EOS id.
    stop_ids: Vec<u32>,
    /// The grammar's EOS id (the tokenizer's first stop id).
    eos: u32,
    /// The masked copy of the last row of logits (reused, one allocation).
    masked: Vec<f32>,
}

impl std::fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMask")
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

impl TokenMask {
    /// Compiles `grammar` over `factory`'s vocabulary; the error says what
    /// llguidance could not compile (an unsupported keyword, a bad regex).
    pub fn new(
        factory: &ParserFactory,
        grammar: TopLevelGrammar,
        stop_ids: &[u32],
    ) -> Result<TokenMask, String> {
        let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        Ok(TokenMask {
            matcher,
            stop_ids: stop_ids.to_vec(),
            eos: factory.tok_env().tok_trie().eos_token(),
            masked: Vec::new(),
        })
    }

    /// `logits` with every token the grammar forbids now set to minus
    /// infinity (ids past the tokenizer's vocabulary too).
    pub fn apply(&mut self, logits: &[f32]) -> Result<&[f32], String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let may_stop = mask.is_allowed(self.eos);
        let allowed_len = mask.len();
        self.masked.clear();
        self.masked
            .extend(logits.iter().enumerate().map(|(id, &logit)| {
                let id = id as u32;
                let allowed = (id as usize) < allowed_len && mask.is_allowed(id)
                    || may_stop && self.stop_ids.contains(&id);
                if allowed {
                    logit
                } else {
                    f32::NEG_INFINITY
                }
            }));
        Ok(&self.masked)
    }

    /// Moves the grammar past `id`, the token just sampled from the masked
    /// logits. A stop id ends the sequence and needs no step.
    pub fn accept(&mut self, id: u32) -> Result<(), String> {
        if self.stop_ids.contains(&id) {
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }
}
