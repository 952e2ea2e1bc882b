//! The speculation flags `serve` and `generate` share.

use switchyard_engine::speculate::{Speculation, DEFAULT_MAX_DRAFT};

#[derive(clap::Args, Clone, Debug)]
pub struct SpeculateArgs {
    /// Speculative decoding: `ngram` drafts tokens from the prompt and the
    /// text so far and verifies them in one forward pass (exact: the output
    /// is what plain decoding samples; it drafts only while few sequences
    /// decode and its drafts are mostly kept) and, with a --draft-model,
    /// takes the draft model's tokens where the lookup finds nothing;
    /// `draft` takes the --draft-model's tokens only; `off` decodes one
    /// token per step.
    #[arg(long, default_value = "ngram", value_parser = ["ngram", "draft", "off"])]
    pub speculate: String,
    /// The most tokens one draft may propose (1 to 64).
    #[arg(long, default_value_t = DEFAULT_MAX_DRAFT)]
    pub draft_max: usize,
}

impl SpeculateArgs {
    pub fn speculation(&self) -> anyhow::Result<Speculation> {
        Speculation::parse(&self.speculate, self.draft_max)
            .map_err(|e| anyhow::anyhow!("--draft-max: {e}"))
    }
}
