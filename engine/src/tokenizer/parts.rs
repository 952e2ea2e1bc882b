//! What a source-specific loader (`gguf.rs`, `hf.rs`) hands back to
//! [`Tokenizer::load`](super::Tokenizer::load); a file of its own because the loaders
//! build it and the tokenizer calls the loaders.

/// What a source-specific loader hands back.
#[derive(Debug)]
pub(super) struct Parts {
    pub(super) tok: tokenizers::Tokenizer,
    pub(super) bos_id: Option<u32>,
    pub(super) eos_id: Option<u32>,
    /// End-of-turn ids the source names explicitly (GGUF `eot`/`eom`).
    pub(super) extra_eos: Vec<u32>,
    pub(super) add_bos: bool,
    pub(super) add_eos: bool,
    pub(super) chat_template: Option<String>,
}
