//! Choosing the next token from logits.
