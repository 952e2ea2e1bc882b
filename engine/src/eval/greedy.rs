//! Batched greedy generation for generation items: every prompt is
//! prefilled together, then all unfinished sequences decode one token per
//! step until end of sequence, the end of the answer's line, or the token limit.

use switchyard_kernels::Backend;

use crate::model::{LogitRows, SequenceChunk};
use crate::sampling::argmax;
use crate::tokenizer::Tokenizer;

use super::loglik::Scorer;
use super::normalize::answer_complete;
use super::EvalError;

/// What each prompt generated (special tokens left out), at most
/// `max_tokens` tokens each (fewer where the context window ends first).
pub fn generate<B: Backend>(
    scorer: &mut Scorer<'_, B>,
    tokenizer: &Tokenizer,
    prompts: &[&[u32]],
    max_tokens: usize,
) -> Result<Vec<String>, EvalError> {
    let model = scorer.model();
    let backend = scorer.backend();
    let vocab = model.config().vocab_size;
    let context = model.config().context_length;
    let limits: Vec<usize> = prompts
        .iter()
        .map(|p| max_tokens.min(context.saturating_sub(p.len())))
        .collect();
    let blocks = super::cache::eval_blocks(backend)?;
    let mut caches = prompts
        .iter()
        .zip(&limits)
        .map(|(p, limit)| super::cache::eval_cache(backend, &blocks, model, p.len() + limit))
        .collect::<Result<Vec<_>, _>>()?;
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut texts = vec![String::new(); prompts.len()];
    let mut done: Vec<bool> = limits.iter().map(|&l| l == 0).collect();
    // The token each sequence feeds next (its last prompt token's successor).
    let mut next = vec![0u32; prompts.len()];

    let mut fed = vec![0usize; prompts.len()];
    loop {
        let (mut chunks, ending) =
            super::cache::prefill_step(backend, prompts.iter().copied(), &mut caches, &mut fed)?;
        if chunks.is_empty() {
            break;
        }
        let logits = scorer.forward(&mut blocks.lock(), &mut chunks)?;
        for (row, &i) in logits.chunks_exact(vocab).zip(&ending) {
            next[i] = argmax(row);
        }
    }

    loop {
        // Take each sequence's chosen token; decide whether it goes on.
        for i in 0..prompts.len() {
            if done[i] {
                continue;
            }
            let token = next[i];
            if tokenizer.eos_ids().contains(&token) {
                done[i] = true;
                continue;
            }
            generated[i].push(token);
            texts[i] = tokenizer.decode(&generated[i], true)?;
            if answer_complete(&texts[i]) || generated[i].len() >= limits[i] {
                done[i] = true;
            }
        }
        let mut chunks = Vec::new();
        let mut owners = Vec::new();
        for (i, cache) in caches.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let start_pos = prompts[i].len() + generated[i].len() - 1;
            chunks.push(SequenceChunk {
                tokens: std::slice::from_ref(&next[i]),
                start_pos,
                table: cache.prepare(backend, start_pos..start_pos + 1)?,
                logits: LogitRows::Last,
                prompt: false,
            });
            owners.push(i);
        }
        if chunks.is_empty() {
            break;
        }
        let logits = scorer.forward(&mut blocks.lock(), &mut chunks)?;
        let picks: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
        for (&i, pick) in owners.iter().zip(picks) {
            next[i] = pick;
        }
    }
    Ok(texts)
}
