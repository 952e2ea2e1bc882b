//! Rebuilding a tokenizer from GGUF `tokenizer.ggml.*` metadata.
//!
//! The aim is llama.cpp's ids for the same file: `gpt2` vocabularies are
//! byte-level BPE whose pre-tokenizer regexes are chosen by
//! `tokenizer.ggml.pre` the way llama.cpp chooses them; `llama` vocabularies
//! are SentencePiece BPE driven by `tokenizer.ggml.scores` (see `spm.rs`).
//! Control tokens are registered as special added tokens so they are matched
//! whole inside text.

use std::path::Path;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::parts::Parts;
use super::TokenizerError;
use crate::formats::gguf::Metadata;
use crate::tokenizer::gguf::key_errors::{bad_key, build_error, missing_or_bad};

mod key_errors;
mod pre;
mod spm;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_NORMAL: u64 = 1;
const TOKEN_TYPE_UNKNOWN: u64 = 2;
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// The vocabulary as the metadata lists it, checked for consistency.
struct GgufVocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<u64>,
}

pub(super) fn load(file: &Path, metadata: &Metadata) -> Result<Parts, TokenizerError> {
    let model = required_str(file, metadata, "tokenizer.ggml.model")?;
    let vocab = read_vocab(file, metadata)?;
    let mut tok = match model {
        "gpt2" => build_byte_level(file, metadata, &vocab)?,
        "llama" => spm::build(file, metadata, &vocab.tokens)?,
        other => {
            return Err(TokenizerError::UnsupportedModel {
                file: file.to_path_buf(),
                model: other.to_string(),
            })
        }
    };
    add_special_tokens(&mut tok, &vocab);

    let id_key = |key: &str| -> Result<Option<u32>, TokenizerError> {
        match metadata.get_u64(key) {
            None => Ok(None),
            Some(id) if (id as usize) < vocab.tokens.len() => Ok(Some(id as u32)),
            Some(id) => Err(bad_key(
                file,
                key,
                format!(
                    "id {id} is outside the vocabulary of {} tokens",
                    vocab.tokens.len()
                ),
            )),
        }
    };
    let bos_id = id_key("tokenizer.ggml.bos_token_id")?;
    let eos_id = id_key("tokenizer.ggml.eos_token_id")?;
    let extra_eos = [
        id_key("tokenizer.ggml.eot_token_id")?,
        id_key("tokenizer.ggml.eom_token_id")?,
    ]
    .into_iter()
    .flatten()
    .collect();
    // llama.cpp's defaults when the keys are absent: SentencePiece adds BOS, BPE does not.
    let add_bos = metadata
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(model == "llama");
    let add_eos = metadata
        .get_bool("tokenizer.ggml.add_eos_token")
        .unwrap_or(false);
    let chat_template = metadata
        .get_str("tokenizer.chat_template")
        .map(str::to_string);

    Ok(Parts {
        tok,
        bos_id,
        eos_id,
        extra_eos,
        add_bos,
        add_eos,
        chat_template,
    })
}

fn read_vocab<'a>(file: &Path, metadata: &'a Metadata) -> Result<GgufVocab<'a>, TokenizerError> {
    let key = "tokenizer.ggml.tokens";
    let tokens = metadata
        .get_str_array(key)
        .ok_or_else(|| missing_or_bad(file, metadata, key, "an array of strings"))?;
    let types = match metadata.get_array("tokenizer.ggml.token_type") {
        // Without types every token is ordinary text.
        None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        Some(values) => values
            .iter()
            .map(|v| v.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| {
                bad_key(
                    file,
                    "tokenizer.ggml.token_type",
                    "not an array of integers".into(),
                )
            })?,
    };
    if types.len() != tokens.len() {
        return Err(bad_key(
            file,
            "tokenizer.ggml.token_type",
            format!("{} types for {} tokens", types.len(), tokens.len()),
        ));
    }
    Ok(GgufVocab { tokens, types })
}

/// `gpt2`: byte-level BPE over the GGUF tokens and merges.
fn build_byte_level(
    file: &Path,
    metadata: &Metadata,
    vocab: &GgufVocab<'_>,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges_key = "tokenizer.ggml.merges";
    let merges = metadata
        .get_str_array(merges_key)
        .ok_or_else(|| missing_or_bad(file, metadata, merges_key, "an array of strings"))?
        .into_iter()
        .enumerate()
        .map(|(i, merge)| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    bad_key(
                        file,
                        merges_key,
                        format!("entry {i} `{merge}` is not two tokens separated by a space"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pre_name = metadata.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let pre = pre::lookup(pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
        file: file.to_path_buf(),
        pre: pre_name.to_string(),
        supported: pre::SUPPORTED.join(", "),
    })?;

    let vocab_map: Vocab = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.to_string(), id as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| build_error(file, e))?;

    let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| build_error(file, e))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    // The regexes above did the splitting; ByteLevel only maps bytes to its alphabet.
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));

    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Sequence::new(steps)));
    tok.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tok)
}

/// Registers control, user-defined and unknown tokens as added tokens so
/// that their text is matched whole, as llama.cpp's special-token pass does.
fn add_special_tokens(tok: &mut tokenizers::Tokenizer, vocab: &GgufVocab<'_>) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (token, &kind) in vocab.tokens.iter().zip(&vocab.types) {
        if token.is_empty() {
            continue;
        }
        match kind {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => {
                special.push(AddedToken::from(token.to_string(), true))
            }
            TOKEN_TYPE_USER_DEFINED => {
                user.push(AddedToken::from(token.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    tok.add_special_tokens(&special);
    tok.add_tokens(&user);
}

fn required_str<'a>(
    file: &Path,
    metadata: &'a Metadata,
    key: &str,
) -> Result<&'a str, TokenizerError> {
    metadata
        .get_str(key)
        .ok_or_else(|| missing_or_bad(file, metadata, key, "a string"))
}
