//! `llama` vocabularies: SentencePiece BPE rebuilt from `tokenizer.ggml.scores`.
//!
//! SentencePiece merges, at each step, the adjacent pair whose concatenation
//! is the vocabulary entry with the highest score (leftmost on ties). A BPE
//! model reproduces that with one merge `(a, b)` for every way to split each
//! entry into two entries, ranked by the score of the entry. Spaces become
//! `▁`; characters outside the vocabulary fall back to `<0xXX>` byte tokens.

use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::key_errors::{bad_key, build_error, missing_or_bad};
use super::TokenizerError;
use crate::formats::gguf::Metadata;

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

pub(super) fn build(
    file: &Path,
    metadata: &Metadata,
    tokens: &[&str],
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let scores_key = "tokenizer.ggml.scores";
    let scores: Vec<f64> = metadata
        .get_array(scores_key)
        .ok_or_else(|| missing_or_bad(file, metadata, scores_key, "an array of floats"))?
        .iter()
        .map(|v| v.as_f64())
        .collect::<Option<_>>()
        .ok_or_else(|| bad_key(file, scores_key, "not an array of numbers".into()))?;
    if scores.len() != tokens.len() {
        return Err(bad_key(
            file,
            scores_key,
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }

    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.to_string(), id as u32))
        .collect();
    let merges = merges_by_score(tokens, &scores, &vocab);
    let unk_id = metadata
        .get_u64("tokenizer.ggml.unknown_token_id")
        .unwrap_or(0) as usize;
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = tokens.get(unk_id) {
        builder = builder.unk_token(unk.to_string());
    }
    let bpe = builder.build().map_err(|e| build_error(file, e))?;

    // llama.cpp's default for `llama` vocabularies is to prefix a space.
    let add_space_prefix = metadata
        .get_bool("tokenizer.ggml.add_space_prefix")
        .unwrap_or(true);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
    }
    normalizers.push(
        Replace::new(" ", SPACE)
            .map_err(|e| build_error(file, e))?
            .into(),
    );
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ")
            .map_err(|e| build_error(file, e))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tok)
}

/// Every split of every entry into two entries, best-scoring entry first.
fn merges_by_score(tokens: &[&str], scores: &[f64], vocab: &Vocab) -> Vec<(String, String)> {
    let mut ranked: Vec<(f64, &str, &str)> = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                ranked.push((score, left, right));
            }
        }
    }
    // Stable sort: equal scores keep id order, a deterministic tie-break.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
        .into_iter()
        .map(|(_, left, right)| (left.to_string(), right.to_string()))
        .collect()
}
