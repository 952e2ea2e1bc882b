//! Speculative decoding: tokens proposed from the sequence's own text or
//! by a smaller draft model, verified by the target model in one forward
//! pass.
//!
//! A decoding sequence normally runs one row per step. When its recent
//! text has occurred before (a code edit, a quoted document, an answer
//! that repeats its sources), the tokens that followed that earlier
//! occurrence are a cheap guess at what comes next ([`Ngram`], the prompt
//! lookup of llama.cpp's `lookup` mode and vLLM's `ngram` method). The
//! step then runs the last sampled token and the `k` drafted tokens as
//! `k + 1` rows of the sequence, at the positions they would take; row `i`
//! gives the logits after draft `i`. On the CPU a decode step is bound by
//! reading the weights, so a few more rows cost far less than as many
//! steps.
//!
//! **Exact.** Every emitted token is sampled, as without speculation, by
//! the sequence's own sampler from its own row ([`verify`]): a draft
//! token is kept only when the sampled token equals it, and the first
//! sampled token that differs is emitted in its place and ends the step.
//! For a deterministic draft this *is* the standard acceptance rule
//! (accept `d` with probability `p(d)`, else draw from the residual
//! `max(p - q, 0)` normalised, where `q` is one-hot on `d`: that residual
//! is `p` without `d`), so the output distribution is unchanged; it also
//! draws one random number per emitted token, as plain decoding does, so
//! a seeded request gives the same text with speculation on or off.
//! Penalties see the emitted tokens in order, a grammar (structured
//! output) masks each row from the state its emitted tokens left (it
//! never sees a rejected draft), and greedy decoding picks the same
//! argmax. Nothing of the request's sampling needs speculation off.
//!
//! **Rollback.** After a verify step the sequence's KV is truncated to
//! the tokens it kept ([`crate::kv::SequenceKv::truncate`]: blocks wholly
//! past the end go back to the store) and the next step writes from
//! there. A sliding-window layer's ring holds `RING_SLACK` positions beyond
//! its window, so drafts of at most [`MAX_DRAFT`] tokens never overwrite
//! a key the window still needs.
//!
//! **When.** Each sequence's [`DraftControl`] lengthens its drafts while
//! they are accepted, shortens them when they are not, and stops drafting
//! for a growing number of the drafts it finds when its measured acceptance
//! falls low.
//! The executor drafts only while it is not busy (few sequences decoding,
//! no prompt waiting: `serving::group`): under load the extra rows would
//! take compute from other sequences' tokens.
//!
//! **Draft checkpoint.** A served model may have a draft model of the
//! same tokenizer ([`DraftModel`], `--draft-model`): its greedy tokens are
//! a second source of drafts, used when prompt lookup finds nothing
//! (`ngram` mode) or alone (`draft` mode). Verification is the same, so
//! the output does not depend on the source.
//!
//! - `ngram.rs`: the prompt-lookup drafter;
//! - `draft_model.rs`: the draft checkpoint and a sequence's run through it;
//! - `control.rs`: per-sequence draft length and on/off;
//! - `verify.rs`: the acceptance loop.

mod control;
mod draft_model;
mod ngram;
mod verify;

pub use control::DraftControl;
pub use draft_model::{DraftError, DraftModel, DraftRun};
pub use ngram::Ngram;
pub use verify::{verify, Verdict};

/// The longest draft a step verifies. Below `RING_SLACK` (128) so that
/// rejected drafts never reach a windowed layer's live keys (see the
/// module docs).
pub const MAX_DRAFT: usize = 64;

const _: () = assert!(MAX_DRAFT < switchyard_kernels::kv::RING_SLACK);

/// Sequences decoding at once up to which the executor drafts. A verify
/// row costs its arithmetic; with one or two sequences a step is bound by
/// reading the weights and the extra rows come nearly free, while a
/// batch already spends its arithmetic on other sequences' tokens.
pub const MAX_DECODING: usize = 2;

/// Whether drafts pay this step: at most [`MAX_DECODING`] sequences
/// decode, and no prompt runs (`prefilling`) or waits for a slot
/// (`waiting`): prompt chunks would give up rows to the drafts.
pub fn drafts_pay(decoding: usize, prefilling: usize, waiting: usize) -> bool {
    decoding <= MAX_DECODING && prefilling == 0 && waiting == 0
}

/// Whether and how sequences speculate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speculation {
    /// Plain decoding: one row per sequence per step.
    Off,
    /// Drafts by prompt lookup ([`Ngram`]), at most `max_draft` tokens a
    /// step; by the checkpoint's draft model, where it has one, when the
    /// lookup finds nothing.
    Ngram { max_draft: usize },
    /// Drafts by the checkpoint's draft model only ([`DraftModel`]; a
    /// checkpoint without one decodes plainly).
    Draft { max_draft: usize },
}

/// The default draft length bound (see `control.rs` for how a sequence's
/// own length moves below it).
pub const DEFAULT_MAX_DRAFT: usize = 8;

impl Default for Speculation {
    fn default() -> Self {
        Speculation::Ngram {
            max_draft: DEFAULT_MAX_DRAFT,
        }
    }
}

impl Speculation {
    /// `mode` as the `--speculate` flag names it (`off`, `ngram`, `draft`), with
    /// drafts of at most `max_draft` tokens (1 to [`MAX_DRAFT`]).
    pub fn parse(mode: &str, max_draft: usize) -> Result<Speculation, String> {
        if max_draft == 0 || max_draft > MAX_DRAFT {
            return Err(format!(
                "a draft length of {max_draft}: use 1 to {MAX_DRAFT} tokens"
            ));
        }
        match mode {
            "off" => Ok(Speculation::Off),
            "ngram" => Ok(Speculation::Ngram { max_draft }),
            "draft" => Ok(Speculation::Draft { max_draft }),
            other => Err(format!(
                "unknown speculation mode {other:?}: use off, ngram or draft"
            )),
        }
    }

    /// A new sequence's controller, `None` when speculation is off.
    pub fn control(&self) -> Option<DraftControl> {
        match *self {
            Speculation::Off => None,
            Speculation::Ngram { max_draft } | Speculation::Draft { max_draft } => {
                Some(DraftControl::new(max_draft))
            }
        }
    }

    /// Whether prompt lookup drafts.
    pub fn looks_up(&self) -> bool {
        matches!(self, Speculation::Ngram { .. })
    }

    /// Whether a checkpoint's draft model drafts (where it has one).
    pub fn uses_draft_model(&self) -> bool {
        !matches!(self, Speculation::Off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_names_a_mode_and_a_bounded_length() {
        assert_eq!(Speculation::parse("off", 8), Ok(Speculation::Off));
        assert_eq!(
            Speculation::parse("ngram", 5),
            Ok(Speculation::Ngram { max_draft: 5 })
        );
        assert_eq!(
            Speculation::parse("draft", 5),
            Ok(Speculation::Draft { max_draft: 5 })
        );
        assert!(Speculation::parse("lookup", 5)
            .unwrap_err()
            .contains("off, ngram or draft"));
        assert!(Speculation::parse("ngram", 0).is_err());
        assert!(Speculation::parse("ngram", MAX_DRAFT + 1).is_err());
    }
}
