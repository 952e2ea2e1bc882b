//! `switchyard generate` (being built).

#[derive(clap::Args)]
pub struct GenerateArgs {}

pub fn run(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`switchyard generate` is being built")
}
