//! `switchyard logits` (being built).

#[derive(clap::Args)]
pub struct LogitsArgs {}

pub fn run(_args: LogitsArgs) -> anyhow::Result<()> {
    anyhow::bail!("`switchyard logits` is being built")
}
