//! `switchyard logits`: runs the forward pass on given token ids and writes
//! the logits as `.npy`, optionally followed by greedy decoding. This is how
//! the NumPy reference checks the engine's numbers.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use switchyard_engine::kv::KvPool;
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::session::Session;

use switchyard_kernels::Backend;

use super::device::{load_adapter, load_model, on_device, DeviceArgs, OnDevice};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Positions {
    /// Logits of the last prompt token only.
    Last,
    /// Logits of every prompt token.
    All,
}

#[derive(clap::Args)]
pub struct LogitsArgs {
    /// A GGUF file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "tokens_file")]
    tokens: Vec<u32>,
    /// A JSON file holding the prompt as an array of token ids.
    #[arg(long, conflicts_with = "tokens")]
    tokens_file: Option<PathBuf>,
    /// Where to write the logits: float32 `.npy` of shape [rows, vocab].
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "last")]
    positions: Positions,
    /// After the prompt, decode this many tokens greedily (end-of-sequence
    /// tokens do not stop it) and print them.
    #[arg(long, default_value_t = 0)]
    greedy: usize,
    /// A LoRA adapter over the model: a PEFT folder or a llama.cpp GGUF
    /// adapter.
    #[arg(long)]
    lora: Option<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    on_device(
        args.device.device,
        args.device.count(),
        args.device.attention(),
        Logits(args),
    )
}

struct Logits(LogitsArgs);

impl OnDevice for Logits {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<()> {
        logits(backend.as_ref(), self.0)
    }
}

fn logits<B: Backend>(backend: &B, args: LogitsArgs) -> anyhow::Result<()> {
    let prompt = match &args.tokens_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read token file {}", path.display()))?;
            serde_json::from_str::<Vec<u32>>(&text)
                .with_context(|| format!("{} must be a JSON array of token ids", path.display()))?
        }
        None => args.tokens.clone(),
    };
    anyhow::ensure!(
        !prompt.is_empty(),
        "the prompt is empty: give --tokens or --tokens-file"
    );
    let checkpoint = load_model(&args.model)?;
    let model = LlamaModel::load(backend, &checkpoint)?;
    let adapter = load_adapter(backend, args.lora.as_deref(), &checkpoint)?;
    let vocab = model.config().vocab_size;
    let kv = KvPool::new(args.device.kv());
    let mut session = Session::with_kv(backend, &model, &kv, prompt.len() + args.greedy)?
        .with_adapter(adapter.as_ref());
    let rows = match args.positions {
        Positions::Last => LogitRows::Last,
        Positions::All => LogitRows::All,
    };
    let logits = session.feed(&prompt, rows)?;
    super::npy::write_f32(&args.out, &[logits.len() / vocab, vocab], &logits)
        .with_context(|| format!("cannot write {}", args.out.display()))?;

    let mut generated = Vec::with_capacity(args.greedy);
    let mut last = logits[logits.len() - vocab..].to_vec();
    while generated.len() < args.greedy {
        let next = switchyard_engine::sampling::argmax(&last);
        generated.push(next);
        if generated.len() < args.greedy {
            last = session.decode(&[next], LogitRows::Last)?;
        }
    }
    println!(
        "{}",
        serde_json::json!({ "rows": logits.len() / vocab, "vocab": vocab, "greedy": generated })
    );
    Ok(())
}
