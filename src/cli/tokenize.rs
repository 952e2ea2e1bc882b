//! `switchyard tokenize` (being built).

#[derive(clap::Args)]
pub struct TokenizeArgs {}

pub fn run(_args: TokenizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("`switchyard tokenize` is being built")
}
