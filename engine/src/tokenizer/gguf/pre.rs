//! Pre-tokenizer regexes for byte-level BPE, by `tokenizer.ggml.pre` name.
//!
//! llama.cpp splits text with a list of regexes applied one after another
//! (each splitting the pieces the previous left, keeping both matches and
//! the text between them); the same is a sequence of `Split` pre-tokenizers
//! with the `Isolated` behaviour. The regexes below are the ones the model
//! families' `tokenizer.json` files use, which llama.cpp mirrors.

/// How one family splits text before BPE.
pub(super) struct PreTokenizer {
    pub regexes: &'static [&'static str],
    /// Words already in the vocabulary are taken whole, without merges
    /// (Llama 3's tokenizer behaves this way).
    pub ignore_merges: bool,
}

/// GPT-2's word regex.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's regex (case-insensitive contractions, digits in groups of up to 3).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's regex (as Llama 3's, but single digits).
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Names accepted in `tokenizer.ggml.pre`, for error messages.
pub(super) const SUPPORTED: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "smollm",
    "starcoder",
    "refact",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "qwen2",
];

/// The pre-tokenizer for a `tokenizer.ggml.pre` name.
pub(super) fn lookup(name: &str) -> Option<PreTokenizer> {
    let (regexes, ignore_merges): (&'static [&'static str], bool) = match name {
        // llama.cpp's fallback for unnamed BPE vocabularies.
        "default" => (
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
        ),
        "gpt-2" | "gpt2" => (&[GPT2], false),
        // SmolLM and StarCoder: every digit on its own, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" => (&[r"\p{N}", GPT2], false),
        "llama-bpe" | "llama3" | "llama-v3" => (&[LLAMA3], true),
        "qwen2" => (&[QWEN2], false),
        _ => return None,
    };
    Some(PreTokenizer {
        regexes,
        ignore_merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

    fn split(name: &str, text: &str) -> Vec<String> {
        let pre = lookup(name).unwrap();
        let mut pretokenized = PreTokenizedString::from(text);
        for regex in pre.regexes {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .unwrap();
            split.pre_tokenize(&mut pretokenized).unwrap();
        }
        pretokenized
            .get_splits(
                tokenizers::OffsetReferential::Original,
                tokenizers::OffsetType::Byte,
            )
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    #[test]
    fn every_supported_name_compiles() {
        for name in SUPPORTED {
            let pre = lookup(name).unwrap();
            assert!(!pre.regexes.is_empty(), "{name}");
            split(name, "warm up");
        }
        assert!(lookup("mystery").is_none());
    }

    #[test]
    fn families_split_digits_and_contractions_their_own_way() {
        assert_eq!(split("smollm", "ab 123"), ["ab", " ", "1", "2", "3"]);
        assert_eq!(split("gpt2", "ab 12345"), ["ab", " 12345"]);
        assert_eq!(
            split("llama-bpe", "I'M 12345"),
            ["I", "'M", " ", "123", "45"]
        );
        assert_eq!(
            split("qwen2", "x 123\n\n"),
            ["x", " ", "1", "2", "3", "\n\n"]
        );
    }
}
