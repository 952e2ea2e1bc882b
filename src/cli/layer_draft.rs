//! `switchyard layer-draft BASE OUT --layers 0-9,29`: a draft checkpoint
//! for speculative decoding made of some of the model's own layers (see
//! `switchyard_engine::formats::gguf::write_layer_subset`).

use std::path::PathBuf;

use anyhow::Context;
use switchyard_engine::formats::gguf::{parse_layers, spell_layers, write_layer_subset, GgufFile};

use super::models::human_bytes;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Serve it as the model's draft: `switchyard serve --model BASE \
                        --draft-model OUT` (or `generate ... --draft-model OUT`). The draft is \
                        untrained: its tokens are only guesses, which the model verifies, so \
                        the output is the model's own whatever the draft proposes."
)]
pub struct LayerDraftArgs {
    /// The GGUF checkpoint to take the layers from.
    pub base: PathBuf,
    /// The GGUF file to write.
    pub out: PathBuf,
    /// The layers to keep, counted from 0: numbers and ranges, e.g. `0-9,29`.
    #[arg(long)]
    pub layers: String,
}

pub fn run(args: LayerDraftArgs) -> anyhow::Result<()> {
    let base = GgufFile::open(&args.base)
        .with_context(|| format!("cannot read {}", args.base.display()))?;
    let keep = parse_layers(&args.layers).map_err(|e| anyhow::anyhow!("--layers: {e}"))?;
    let bytes = write_layer_subset(&base, &keep, &args.out)?;
    eprintln!(
        "layer-draft: wrote {} ({}, layers {} of {})",
        args.out.display(),
        human_bytes(bytes),
        spell_layers(&keep),
        args.base.display()
    );
    Ok(())
}
