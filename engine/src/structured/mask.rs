//! One sequence's grammar state: which tokens may come next, and the step
//! that moves it on.

use std::sync::OnceLock;

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
    /// Whether `masked` is this step's row (computed, not yet sampled).
    ready: bool,
}

impl std::fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMask")
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

impl TokenMask {
    /// Compiles `grammar` over `factory`'s vocabulary into a matcher at its
    /// start; the error says what llguidance could not compile (an
    /// unsupported keyword, a bad regex). Recursive inside llguidance: run it
    /// on a compile thread ([`super::pool`]).
    pub fn compile(factory: &ParserFactory, grammar: TopLevelGrammar) -> Result<Matcher, String> {
        let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        let eos = factory.tok_env().tok_trie().eos_token();
        trial(&matcher, eos)?;
        Ok(matcher)
    }

    /// The mask that follows `matcher` (compiled by [`TokenMask::compile`]
    /// over a vocabulary whose EOS id is `eos`); `stop_ids` end generation.
    pub fn new(matcher: Matcher, eos: u32, stop_ids: &[u32]) -> TokenMask {
        TokenMask {
            matcher,
            stop_ids: stop_ids.to_vec(),
            eos,
            masked: Vec::new(),
            ready: false,
        }
    }

    /// `logits` with every token the grammar forbids now set to minus
    /// infinity (ids past the tokenizer's vocabulary too). The row is kept
    /// until the next [`TokenMask::accept`], so a step can mask its rows
    /// ahead of sampling (in parallel, see [`mask_rows`]) and the sampler
    /// then reads the same row.
    pub fn apply(&mut self, logits: &[f32]) -> Result<&[f32], String> {
        if !self.ready {
            self.compute(logits)?;
        }
        Ok(&self.masked)
    }

    fn compute(&mut self, logits: &[f32]) -> Result<(), String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        self.masked.clear();
        self.masked.resize(logits.len(), f32::NEG_INFINITY);
        // Word by word: most words of a grammar's mask are all-forbidden
        // or all-allowed, so the bit test runs only on the mixed ones.
        let words = mask.as_slice();
        for (w, (out, row)) in self
            .masked
            .chunks_mut(32)
            .zip(logits.chunks(32))
            .enumerate()
        {
            match words.get(w).copied().unwrap_or(0) {
                0 => {}
                u32::MAX => out.copy_from_slice(row),
                bits => {
                    for (bit, (o, &l)) in out.iter_mut().zip(row).enumerate() {
                        if bits & (1 << bit) != 0 {
                            *o = l;
                        }
                    }
                }
            }
        }
        if mask.is_allowed(self.eos) {
            for &id in &self.stop_ids {
                if let (Some(o), Some(&l)) =
                    (self.masked.get_mut(id as usize), logits.get(id as usize))
                {
                    *o = l;
                }
            }
        }
        self.ready = true;
        Ok(())
    }

    /// Moves the grammar past `id`, the token just sampled from the masked
    /// logits. A stop id ends the sequence and needs no step.
    pub fn accept(&mut self, id: u32) -> Result<(), String> {
        self.ready = false;
        if self.stop_ids.contains(&id) {
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }
}

/// Tokens a compiled grammar is walked through before it is accepted.
const TRIAL_TOKENS: usize = 6;

/// Walks a copy of `matcher` through the first [`TRIAL_TOKENS`] tokens it
/// allows (the lowest id each time, `eos` left out), so that a grammar the
/// parser cannot follow fails here, at prepare time (a 400), not in the
/// stream. llguidance builds its parse rows as tokens come: an object of
/// thousands of optional properties compiled and then failed at its second
/// token ("Current row has 20007 items; max is 2000"), a 500 error event.
fn trial(matcher: &Matcher, eos: u32) -> Result<(), String> {
    let mut walk = matcher.deep_clone();
    for _ in 0..TRIAL_TOKENS {
        if walk.is_stopped() {
            break;
        }
        let mut mask = walk.compute_mask().map_err(failed)?;
        mask.disallow_token(eos);
        let Some(next) = mask.first_bit_set() else {
            break;
        };
        // Ids index a vocabulary of at most u32::MAX tokens.
        let next = u32::try_from(next).map_err(|e| e.to_string())?;
        walk.consume_token(next).map_err(failed)?;
    }
    Ok(())
}

/// What a client reads when the trial walk fails.
fn failed(e: impl std::fmt::Display) -> String {
    format!(
        "the grammar engine cannot follow this schema past its first tokens ({e}); make fewer \
         properties optional (list them in `required`) or simplify the schema"
    )
}

/// Masks each pair's row of logits ahead of sampling, spread over the
/// host's cores: a grammar's mask costs a few hundred microseconds, so a
/// batch of constrained sequences would otherwise keep every core but the
/// executor's idle between forward passes.
pub fn mask_rows(pairs: Vec<(&mut TokenMask, &[f32])>) {
    static THREADS: OnceLock<usize> = OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let per_thread = pairs.len().div_ceil(threads).max(1);
    if pairs.len() <= 1 || per_thread == pairs.len() {
        for (mask, row) in pairs {
            // A failure is kept for the sampler to report (apply computes again).
            let _ = mask.compute(row);
        }
        return;
    }
    let mut pairs = pairs;
    std::thread::scope(|scope| {
        let mut rest = pairs.as_mut_slice();
        while rest.len() > per_thread {
            let (head, tail) = rest.split_at_mut(per_thread);
            scope.spawn(move || {
                head.iter_mut().for_each(|(mask, row)| {
                    let _ = mask.compute(row);
                })
            });
            rest = tail;
        }
        for (mask, row) in rest.iter_mut() {
            let _ = mask.compute(row);
        }
    });
}
