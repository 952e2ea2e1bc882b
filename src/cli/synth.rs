//! `switchyard synth` (being built).

#[derive(clap::Args)]
pub struct SynthArgs {}

pub fn run(_args: SynthArgs) -> anyhow::Result<()> {
    anyhow::bail!("`switchyard synth` is being built")
}
