//! Incremental detokenization for streaming output.
//!
//! Decoding ids one at a time goes wrong in two ways: a character split over
//! several byte tokens decodes to U+FFFD until its last byte arrives, and
//! decoders that look at neighbours (SentencePiece's leading-space strip)
//! give a token different text alone than in context. So each step decodes
//! a short window of recent ids twice — without and with the new ids — and
//! emits the difference once it no longer ends in an incomplete character.

use super::{Tokenizer, TokenizerError};

impl Tokenizer {
    /// A streaming decoder: feed it ids one at a time, get text when it is
    /// complete UTF-8.
    pub fn decode_stream(&self, skip_special: bool) -> DecodeStream {
        DecodeStream::new(self.clone(), skip_special)
    }
}

/// Turns a stream of token ids into a stream of complete UTF-8 text pieces.
#[derive(Clone, Debug)]
pub struct DecodeStream {
    tokenizer: Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the context window decoded before the unread ids.
    prefix_offset: usize,
    /// Ids before this index have had their text emitted.
    read_offset: usize,
}

impl DecodeStream {
    /// A stream over `tokenizer`; see [`Tokenizer::decode_stream`].
    pub fn new(tokenizer: Tokenizer, skip_special: bool) -> DecodeStream {
        DecodeStream {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one id; returns the new text when it forms complete characters,
    /// `None` while a character is still incomplete (or the token has no text).
    pub fn step(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let prefix = self.tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        // The window's text normally extends the prefix's; if a decoder
        // rewrote it, fall back to the char boundary where they diverge.
        let split = if full.starts_with(&prefix) {
            prefix.len()
        } else {
            common_prefix_len(&prefix, &full)
        };
        let new_text = full[split..].to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Keep memory flat over long generations: ids before the window are never read again.
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
        Ok(Some(new_text))
    }

    /// Text of ids still held back (an incomplete character at the end of
    /// generation), decoded lossily; empties the stream.
    pub fn flush(&mut self) -> Result<Option<String>, TokenizerError> {
        if self.read_offset >= self.ids.len() {
            return Ok(None);
        }
        let prefix = self.tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        let split = common_prefix_len(&prefix, &full);
        let rest = &full[split..];
        Ok((!rest.is_empty()).then(|| rest.to_string()))
    }
}

/// Length in bytes of the longest common prefix, on a char boundary of both.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}
