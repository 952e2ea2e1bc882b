//! A small real tokenizer for synthetic models: GPT-2 style byte-level BPE,
//! trained deterministically on a built-in English text.
//!
//! Token ids: the 256 byte tokens first (in byte order), then one token per
//! merge, then the special tokens [`SPECIAL_TOKENS`] at the end.

use std::collections::BTreeMap;

/// The special tokens, in id order, at the end of the vocabulary.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A ChatML chat template, as Hugging Face and GGUF files carry it.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. A model serves many \
requests; the engine switches between checkpoints in microseconds. The router reads the \
request, the policy picks the model, and the scheduler runs the next batch. Tokens stream \
back to the client as soon as they are sampled. There is the question of the answer, and \
then there is the answer to the question. Hello, world! How are you today? I am fine, \
thank you. The weather is nice and the sun is shining on the hills and on the sea. \
Numbers like 1, 2, 3, 10, 42 and 2024 appear in text too. Then the end.";

/// The vocabulary and merges of the synthetic tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticVocab {
    /// Token strings in id order, in GPT-2's byte-to-unicode spelling.
    pub tokens: Vec<String>,
    /// Merges in rank order, each a pair of token strings.
    pub merges: Vec<(String, String)>,
}

impl SyntheticVocab {
    /// Builds a vocabulary of exactly `vocab_size` tokens (at least 259).
    /// If the corpus runs out of pairs before that, the remaining merges are
    /// of the most frequent byte pairs' extensions; in practice the corpus
    /// is large enough for the presets.
    pub fn build(vocab_size: usize) -> Self {
        let to_char = byte_to_unicode();
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| to_char[b as usize].to_string())
            .collect();
        let target = vocab_size.saturating_sub(SPECIAL_TOKENS.len());

        // Words (a leading space belongs to the word, as in GPT-2) with counts.
        let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
        for word in split_words(CORPUS) {
            let symbols = word
                .bytes()
                .map(|b| to_char[b as usize].to_string())
                .collect();
            *words.entry(symbols).or_default() += 1;
        }
        let mut merges = Vec::new();
        while tokens.len() < target {
            let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
            for (symbols, count) in &words {
                for pair in symbols.windows(2) {
                    *pairs.entry((pair[0].clone(), pair[1].clone())).or_default() += count;
                }
            }
            // Most frequent pair; ties go to the smallest pair, for determinism.
            let Some(best) = pairs
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(pair, _)| pair.clone())
            else {
                break;
            };
            let merged = format!("{}{}", best.0, best.1);
            words = words
                .into_iter()
                .map(|(symbols, count)| (merge_pair(&symbols, &best, &merged), count))
                .fold(BTreeMap::new(), |mut acc, (symbols, count)| {
                    *acc.entry(symbols).or_default() += count;
                    acc
                });
            tokens.push(merged);
            merges.push(best);
        }
        tokens.extend(SPECIAL_TOKENS.iter().map(|s| s.to_string()));
        Self { tokens, merges }
    }

    /// The id of a special token.
    pub fn special_id(&self, token: &str) -> Option<u32> {
        self.tokens
            .iter()
            .rposition(|t| t == token)
            .and_then(|i| u32::try_from(i).ok())
    }
}

fn merge_pair(symbols: &[String], pair: &(String, String), merged: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(symbols.len());
    let mut i = 0;
    while i < symbols.len() {
        if i + 1 < symbols.len() && symbols[i] == pair.0 && symbols[i + 1] == pair.1 {
            out.push(merged.to_string());
            i += 2;
        } else {
            out.push(symbols[i].clone());
            i += 1;
        }
    }
    out
}

/// Splits text GPT-2 style, roughly: runs of letters, of digits, or of
/// other non-space characters, each keeping one leading space.
fn split_words(text: &str) -> Vec<String> {
    let class = |c: char| {
        if c.is_alphabetic() {
            0
        } else if c.is_numeric() {
            1
        } else if c.is_whitespace() {
            2
        } else {
            3
        }
    };
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        let starts_new = match current.chars().last() {
            None => false,
            Some(prev) if current == " " => class(c) == 2 && class(prev) == 2,
            Some(prev) => class(c) != class(prev),
        };
        if starts_new {
            words.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// GPT-2's reversible byte → printable character map.
pub fn byte_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_an_exact_size_vocab() {
        let v = SyntheticVocab::build(320);
        assert_eq!(v.tokens.len(), 320);
        assert_eq!(v.merges.len(), 320 - 256 - 3);
        assert_eq!(v.special_id("<|im_end|>"), Some(319));
        assert_eq!(v.tokens[32], "Ġ");
        let unique: std::collections::HashSet<_> = v.tokens.iter().collect();
        assert_eq!(unique.len(), 320, "tokens are unique");
        assert_eq!(SyntheticVocab::build(320), v, "deterministic");
    }

    #[test]
    fn splits_like_gpt2() {
        assert_eq!(
            split_words("Hello, world 42!"),
            ["Hello", ",", " world", " 42", "!"]
        );
    }
}
