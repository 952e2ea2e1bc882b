//! A draft checkpoint: a smaller model of the same tokenizer, resident in
//! the same engine, that proposes the next tokens by greedy decoding for
//! the model it drafts for (the target).
//!
//! Where prompt lookup ([`super::Ngram`]) only guesses text that occurred
//! before, a draft model guesses free text too: a 135M model agrees with
//! a larger one of its family on most tokens of ordinary prose. Its
//! guesses cost `k` of its own (cheap) decode steps per verify step.
//!
//! The drafts are its argmax, a deterministic guess; the target verifies
//! them with its own sampler (`verify.rs`), so the output is the target's
//! whatever the draft proposes (greedy: bit-identical to plain decoding).
//!
//! Each drafting sequence keeps a [`DraftRun`]: the draft model's KV of
//! the sequence's tokens. Before drafting, the run drops what the last
//! step's rejected drafts wrote (the longest common prefix with the
//! sequence's tokens stays) and feeds the tokens it has not seen, then
//! decodes `k` tokens. Its cache is reserved from the same KV budget as
//! every sequence's; when the budget has no room the sequence simply does
//! not draft from the model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_kernels::{Backend, KvPrefix};

use crate::kv::{KvBlocks, KvError, SequenceKv};
use crate::model::{LlamaModel, LogitRows, ModelError, Scratch, SequenceChunk};
use crate::sampling::argmax;
use crate::session::PREFILL_CHUNK;
use crate::tokenizer::Tokenizer;

/// A checkpoint that drafts for another.
pub struct DraftModel<B: Backend> {
    pub model: LlamaModel<B>,
    /// Where it was loaded from (said at startup).
    pub source: PathBuf,
}

/// Why a draft run could not draft this step (the sequence decodes
/// plainly; the run is dropped and rebuilt when next wanted).
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl<B: Backend> DraftModel<B> {
    /// `model` from `source` as the draft of a target whose tokenizer is
    /// `target` (`target_vocab` logits per row), if the two tokenize
    /// alike: the same vocabulary size and the same text for every token
    /// id, the same end tokens. A draft of another tokenizer would
    /// propose ids that mean other text; its drafts would all be refused.
    pub fn pair(
        model: LlamaModel<B>,
        source: &Path,
        tokenizer: &Tokenizer,
        target: &Tokenizer,
        target_vocab: usize,
    ) -> Result<Self, String> {
        let vocab = model.config().vocab_size;
        if vocab != target_vocab {
            return Err(format!(
                "the draft model has {vocab} logits per token and the served model \
                 {target_vocab}: a draft needs the same tokenizer"
            ));
        }
        if tokenizer.vocab_size() != target.vocab_size() {
            return Err(format!(
                "the draft model's tokenizer has {} tokens and the served model's {}: a \
                 draft needs the same tokenizer",
                tokenizer.vocab_size(),
                target.vocab_size()
            ));
        }
        let differs = (0..tokenizer.vocab_size() as u32)
            .find(|&id| tokenizer.token_text(id) != target.token_text(id));
        if let Some(id) = differs {
            return Err(format!(
                "token {id} is {:?} to the draft model and {:?} to the served model: a \
                 draft needs the same tokenizer",
                tokenizer.token_text(id).unwrap_or_default(),
                target.token_text(id).unwrap_or_default()
            ));
        }
        if tokenizer.eos_ids() != target.eos_ids() {
            return Err(format!(
                "the draft model ends on tokens {:?} and the served model on {:?}",
                tokenizer.eos_ids(),
                target.eos_ids()
            ));
        }
        Ok(DraftModel {
            model,
            source: source.to_path_buf(),
        })
    }
}

/// One sequence's tokens in the draft model's KV cache.
pub struct DraftRun<B: Backend> {
    kv: SequenceKv<B>,
    /// The tokens its cache holds, in order (the sequence's, then the last
    /// draft's but its final token).
    fed: Vec<u32>,
    capacity: usize,
}

impl<B: Backend> DraftRun<B> {
    /// A run of at most `capacity` positions (bounded by the draft's
    /// context), its cache reserved from `blocks`' budget.
    pub fn new(
        backend: &B,
        blocks: &Arc<KvBlocks<B>>,
        model: &LlamaModel<B>,
        capacity: usize,
    ) -> Result<Self, KvError> {
        let capacity = capacity.min(model.config().context_length);
        Ok(DraftRun {
            kv: SequenceKv::for_model(backend, blocks, model, capacity, KvPrefix::none())?,
            fed: Vec::new(),
            capacity,
        })
    }

    /// Appends to `out` up to `k` tokens the draft `model` decodes greedily
    /// after `tokens` (fewer near the end of its cache).
    pub fn draft(
        &mut self,
        backend: &B,
        model: &LlamaModel<B>,
        scratch: &mut Scratch<B>,
        tokens: &[u32],
        k: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), DraftError> {
        // Its last draft token is fed at `tokens.len() + k - 2`.
        let k = k.min((self.capacity + 1).saturating_sub(tokens.len()));
        if k == 0 || tokens.is_empty() {
            return Ok(());
        }
        // Keep what agrees with the sequence; the last token is always fed
        // again-or-first, since its logits give the first draft.
        let common = self
            .fed
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        self.kv.truncate(common)?;
        self.fed.truncate(common);
        let mut next = self.feed(backend, model, scratch, &tokens[common..], true)?;
        for i in 0..k {
            out.push(next);
            if i + 1 < k {
                next = self.feed(backend, model, scratch, &[next], false)?;
            }
        }
        Ok(())
    }

    /// Runs `tokens` after those it holds (catching up on the text, a
    /// `prompt`, or one drafted token); the argmax after the last.
    fn feed(
        &mut self,
        backend: &B,
        model: &LlamaModel<B>,
        scratch: &mut Scratch<B>,
        tokens: &[u32],
        prompt: bool,
    ) -> Result<u32, DraftError> {
        let mut next = 0;
        let count = tokens.len().div_ceil(PREFILL_CHUNK);
        for (i, piece) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let last = i + 1 == count;
            let start = self.fed.len();
            let blocks = Arc::clone(self.kv.blocks());
            let mut chunk = [SequenceChunk {
                tokens: piece,
                start_pos: start,
                table: self.kv.prepare(backend, start..start + piece.len())?,
                logits: if last {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
                prompt,
            }];
            let logits = model.forward(backend, &mut blocks.lock(), &mut chunk, scratch)?;
            self.fed.extend_from_slice(piece);
            if last {
                next = argmax(logits);
            }
        }
        Ok(next)
    }

    /// Bytes its cache reserves from the KV budget.
    pub fn reserved_bytes(&self) -> usize {
        self.kv.reserved_bytes()
    }
}
