//! Tokenizers from `tokenizer.json` or GGUF metadata, through the `tokenizers` crate.
//!
//! [`Tokenizer::load`] builds one from a checkpoint's [`TokenizerSource`]:
//! Hugging Face folders load `tokenizer.json` directly; GGUF files are
//! rebuilt from `tokenizer.ggml.*` metadata so that the ids match
//! llama.cpp's. Both end up as the same [`Tokenizer`]: encode, decode,
//! special ids, the chat template, and a streaming decoder.

mod error;
mod gguf;
mod hf;
mod parts;
mod stream;

use std::sync::Arc;

pub use error::TokenizerError;
pub use stream::DecodeStream;

use crate::formats::TokenizerSource;
use parts::Parts;

/// Texts of tokens that end a chat turn in common model families; when a
/// vocabulary has one of them as a special token, generation stops on it.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
];

/// A loaded tokenizer. Cloning is cheap (shared inner state).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tok: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    bos_token: String,
    eos_token: String,
    chat_template: Option<String>,
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads the tokenizer a checkpoint names.
    pub fn load(source: &TokenizerSource) -> Result<Tokenizer, TokenizerError> {
        let parts = match source {
            TokenizerSource::HuggingFace {
                tokenizer_json,
                tokenizer_config,
            } => hf::load(tokenizer_json, tokenizer_config.as_deref())?,
            TokenizerSource::Gguf { file, metadata } => gguf::load(file, metadata)?,
        };
        Ok(Tokenizer::from_parts(parts))
    }

    fn from_parts(parts: Parts) -> Tokenizer {
        let tok = parts.tok;
        let text_of = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id)).unwrap_or_default();
        let bos_token = text_of(parts.bos_id);
        let eos_token = text_of(parts.eos_id);

        let special_ids: Vec<u32> = tok
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, added)| added.special)
            .map(|(id, _)| id)
            .collect();
        let mut eos_ids: Vec<u32> = parts.eos_id.into_iter().collect();
        eos_ids.extend(parts.extra_eos);
        eos_ids.extend(
            END_OF_TURN_TEXTS
                .iter()
                .filter_map(|text| tok.token_to_id(text))
                .filter(|id| special_ids.contains(id)),
        );
        let mut seen = Vec::with_capacity(eos_ids.len());
        eos_ids.retain(|id| {
            let first = !seen.contains(id);
            seen.push(*id);
            first
        });

        let vocab_size = tok.get_vocab_size(true);
        Tokenizer {
            inner: Arc::new(Inner {
                tok,
                bos_id: parts.bos_id,
                eos_id: parts.eos_id,
                eos_ids,
                add_bos: parts.add_bos,
                add_eos: parts.add_eos,
                bos_token,
                eos_token,
                chat_template: parts.chat_template,
                vocab_size,
            }),
        }
    }

    /// Token ids for `text`. Special-token texts inside `text` (such as
    /// `<|im_start|>`) become their special ids. With `add_special_tokens`,
    /// BOS (and EOS) are added when the model asks for them (GGUF
    /// `tokenizer.ggml.add_bos_token`, HF `add_bos_token` or post-processor).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let inner = &self.inner;
        // The post-processor is never run: BOS/EOS are added here from one
        // decision made at load time, the same way for GGUF and tokenizer.json.
        let encoding = inner
            .tok
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode {
                reason: e.to_string(),
            })?;
        let mut ids = Vec::with_capacity(encoding.len() + 2);
        if add_special_tokens && inner.add_bos {
            ids.extend(inner.bos_id);
        }
        ids.extend_from_slice(encoding.get_ids());
        if add_special_tokens && inner.add_eos {
            ids.extend(inner.eos_id);
        }
        Ok(ids)
    }

    /// Text for `ids`; with `skip_special`, special tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.inner.vocab_size) {
            return Err(TokenizerError::IdOutOfRange {
                id,
                vocab_size: self.inner.vocab_size,
            });
        }
        self.inner
            .tok
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode {
                reason: e.to_string(),
            })
    }

    /// The beginning-of-sequence id, when the vocabulary has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// Ids that end generation: EOS first, then end-of-turn tokens such as
    /// `<|im_end|>` or `<|eot_id|>` present in the vocabulary.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Whether `encode(text, true)` starts with BOS.
    pub fn adds_bos(&self) -> bool {
        self.inner.add_bos && self.inner.bos_id.is_some()
    }

    /// Whether `encode(text, true)` ends with EOS.
    pub fn adds_eos(&self) -> bool {
        self.inner.add_eos && self.inner.eos_id.is_some()
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The vocabulary entry for `id` (byte-level or `▁` form, not decoded text).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.tok.id_to_token(id)
    }

    /// The id of a vocabulary entry (for example `"<|im_end|>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.tok.token_to_id(text)
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` document (GGUF
    /// vocabularies too, as rebuilt here), for tools that read that format.
    pub fn huggingface_json(&self) -> Result<String, TokenizerError> {
        self.inner
            .tok
            .to_string(false)
            .map_err(|e| TokenizerError::Decode {
                reason: format!("cannot serialize the tokenizer: {e}"),
            })
    }

    /// The checkpoint's chat template (Jinja source), when it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// BOS token text for chat templates (`""` when there is none).
    pub fn bos_token(&self) -> &str {
        &self.inner.bos_token
    }

    /// EOS token text for chat templates (`""` when there is none).
    pub fn eos_token(&self) -> &str {
        &self.inner.eos_token
    }
}
