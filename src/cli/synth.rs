//! `switchyard synth`: writes a small deterministic synthetic checkpoint
//! (for tests and benchmarks), as a GGUF file or a Hugging Face folder.

use std::path::PathBuf;

use anyhow::{bail, Context};
use switchyard_engine::synthetic::{write_gguf, write_safetensors, Preset, SyntheticSpec};
use switchyard_kernels::DType;

/// The file layout to write.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SynthFormat {
    /// One .gguf file.
    Gguf,
    /// A Hugging Face folder: config.json, safetensors, tokenizer files.
    Safetensors,
}

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Model family: llama, llama3, smollm2, tinyllama, mistral, qwen2, qwen3, gemma2, gemma3
    /// or phi3.
    #[arg(long, value_parser = parse_preset)]
    pub preset: Preset,
    /// Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k,
    /// q6_k, iq4_nl or iq4_xs
    /// (safetensors: f32, f16 or bf16 only).
    #[arg(long, value_parser = parse_dtype, default_value = "f32")]
    pub dtype: DType,
    /// Seed of the random weights; the same seed gives the same model.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "gguf")]
    pub format: SynthFormat,
    /// Safetensors only: split the weights into this many files plus an index.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// The .gguf file, or the folder for safetensors.
    #[arg(long)]
    pub out: PathBuf,
}

fn parse_preset(name: &str) -> Result<Preset, String> {
    Preset::from_name(name).ok_or_else(|| {
        let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
        format!(
            "unknown preset '{name}'; choose one of {}",
            names.join(", ")
        )
    })
}

fn parse_dtype(name: &str) -> Result<DType, String> {
    DType::from_name(name).ok_or_else(|| {
        let names: Vec<_> = DType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown type '{name}'; choose one of {}", names.join(", "))
    })
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let spec = SyntheticSpec {
        preset: args.preset,
        dtype: args.dtype,
        seed: args.seed,
    };
    match args.format {
        SynthFormat::Gguf => {
            if args.shards != 1 {
                bail!("--shards applies to --format safetensors only");
            }
            write_gguf(&spec, &args.out)
        }
        SynthFormat::Safetensors => write_safetensors(&spec, &args.out, args.shards),
    }
    .with_context(|| format!("writing the synthetic {} checkpoint", args.preset))?;
    eprintln!(
        "wrote synthetic {} ({}, seed {}) to {}",
        args.preset,
        args.dtype,
        args.seed,
        args.out.display()
    );
    Ok(())
}
