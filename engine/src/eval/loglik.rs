//! Batched log-likelihood of given continuations: the prompt-scoring path.
//!
//! A batch of items runs in two kinds of forward steps over one KV cache
//! per item. First every context is prefilled together, keeping only the
//! last row's logits (they score each choice's first token). Then, choice
//! slot by choice slot, every item's choice is fed at the position right
//! after its context, all rows' logits kept: choice `j` overwrites choice
//! `j - 1`'s positions in the cache, so the context's KV is computed once
//! and shared by all its choices. A choice's last token is never fed: no
//! logits after it are needed.
//!
//! Overwriting needs every position of the item to stay in the cache, so
//! an item longer than a sliding window's ring (Gemma 3's local layers)
//! is split by the caller into one item per choice ([`shares_context`]).

use switchyard_kernels::Backend;

use crate::adapter::ResidentAdapter;
use crate::model::{LlamaModel, LogitRows, Scratch, SequenceChunk};

use super::encode::ChoiceTokens;
use super::EvalError;

/// Whether `item`'s choices can share one cache with its context: every
/// position it needs fits every sliding window of `model`.
pub fn shares_context<B: Backend>(model: &LlamaModel<B>, item: &ChoiceTokens) -> bool {
    let capacity = item.capacity();
    model
        .config()
        .layer_windows()
        .iter()
        .all(|w| w.is_none_or(|w| capacity <= w))
}

/// `ln p(target)` under `row`'s logits, with the log-sum-exp in f64.
pub fn log_prob(row: &[f32], target: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    let logit = row
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    f64::from(logit - max) - sum.ln()
}

/// Scores choices of many items on one model, reusing its activation buffers.
pub struct Scorer<'m, B: Backend> {
    backend: &'m B,
    model: &'m LlamaModel<B>,
    /// A LoRA adapter over every row, when the suite evaluates one.
    adapter: Option<&'m ResidentAdapter<B>>,
    scratch: Scratch<B>,
}

impl<'m, B: Backend> Scorer<'m, B> {
    pub fn new(backend: &'m B, model: &'m LlamaModel<B>) -> Self {
        Scorer {
            backend,
            model,
            adapter: None,
            scratch: model.new_scratch(backend),
        }
    }

    /// This scorer with `adapter`'s updates over the base on every row.
    pub fn with_adapter(mut self, adapter: Option<&'m ResidentAdapter<B>>) -> Self {
        self.adapter = adapter;
        self
    }

    /// One forward step of `chunks` (with the adapter, if any); the kept rows' logits.
    pub(super) fn forward(
        &mut self,
        kv: &mut B::KvStore,
        chunks: &mut [SequenceChunk<'_>],
    ) -> Result<&[f32], EvalError> {
        Ok(self
            .model
            .forward_adapted(self.backend, kv, chunks, self.adapter, &mut self.scratch)?)
    }

    pub fn model(&self) -> &'m LlamaModel<B> {
        self.model
    }

    pub fn backend(&self) -> &'m B {
        self.backend
    }

    /// Each item's per-choice log-likelihood: the sum over the choice's
    /// tokens of `ln p(token | context, earlier choice tokens)`. Items that
    /// do not [`shares_context`] must come with one choice each.
    // The choice slot `j` indexes every item's choices, not one slice.
    #[allow(clippy::needless_range_loop)]
    pub fn score(&mut self, items: &[&ChoiceTokens]) -> Result<Vec<Vec<f64>>, EvalError> {
        let vocab = self.model.config().vocab_size;
        let blocks = super::cache::eval_blocks(self.backend)?;
        let mut caches = items
            .iter()
            .map(|item| {
                super::cache::eval_cache(self.backend, &blocks, self.model, item.capacity())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut scores: Vec<Vec<f64>> = items
            .iter()
            .map(|item| vec![0.0; item.choices.len()])
            .collect();

        // Contexts, piece by piece; the last piece keeps its last row.
        let mut fed = vec![0usize; items.len()];
        loop {
            // Items whose context ends in this step, in chunk order: one logits row each.
            let (mut chunks, ending) = super::cache::prefill_step(
                self.backend,
                items.iter().map(|item| item.context.as_slice()),
                &mut caches,
                &mut fed,
            )?;
            if chunks.is_empty() {
                break;
            }
            let logits = self.forward(&mut blocks.lock(), &mut chunks)?;
            for (row, &i) in logits.chunks_exact(vocab).zip(&ending) {
                for (score, choice) in scores[i].iter_mut().zip(&items[i].choices) {
                    *score += log_prob(row, choice[0]);
                }
            }
        }

        // Choice slots: choice j of every item, after its context.
        let slots = items.iter().map(|i| i.choices.len()).max().unwrap_or(0);
        for j in 0..slots {
            let mut chunks = Vec::new();
            let mut owners = Vec::new();
            for (i, (item, cache)) in items.iter().zip(caches.iter_mut()).enumerate() {
                let Some(choice) = item.choices.get(j) else {
                    continue;
                };
                if choice.len() < 2 {
                    continue;
                }
                let start_pos = item.context.len();
                chunks.push(SequenceChunk {
                    tokens: &choice[..choice.len() - 1],
                    start_pos,
                    table: cache.prepare(self.backend, start_pos..start_pos + choice.len() - 1)?,
                    logits: LogitRows::All,
                    prompt: true,
                });
                owners.push(i);
            }
            if chunks.is_empty() {
                continue;
            }
            let logits = self.forward(&mut blocks.lock(), &mut chunks)?;
            let mut rows = logits.chunks_exact(vocab);
            for &i in &owners {
                let choice = &items[i].choices[j];
                for &target in &choice[1..] {
                    if let Some(row) = rows.next() {
                        scores[i][j] += log_prob(row, target);
                    }
                }
            }
        }
        Ok(scores)
    }
}
