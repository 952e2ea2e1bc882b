//! Tokenizers from `tokenizer.json` or GGUF metadata, through the `tokenizers` crate.
