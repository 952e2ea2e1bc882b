//! `switchyard eval`: runs evaluation suites (JSONL) on a checkpoint inside
//! the engine and prints accuracy with its 95% interval.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use switchyard_engine::eval::quality::{now, suite_hash, QualityRecord};
use switchyard_engine::eval::{evaluate_adapted, EvalOptions, Suite};
use switchyard_engine::model::LlamaModel;
use switchyard_engine::tokenizer::Tokenizer;

use std::sync::Arc;

use switchyard_kernels::Backend;

use super::device::{load_adapter, load_model, on_device, DeviceArgs, OnDevice};

#[derive(clap::Args)]
#[command(after_help = "Suite format (one JSON object a line):\n  \
    {\"context\": \"2 + 2 =\", \"choices\": [\" 3\", \" 4\"], \"answer\": 1}   multiple choice\n  \
    {\"prompt\": \"Q: 2 + 2 =\\nA:\", \"answer\": \"4\"}                     generation (greedy, exact match)\n\
    See docs/EVALS.md.")]
pub struct EvalArgs {
    /// A GGUF file or a Hugging Face folder; with --repo, `name@version` in it.
    #[arg(long)]
    pub model: String,
    /// A model repository to resolve --model in.
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// A JSONL suite (repeatable: each is reported on its own).
    #[arg(long, required = true)]
    pub suite: Vec<PathBuf>,
    /// Print one JSON object per suite: {"n", "acc", "acc_norm", "ci95", ...}.
    #[arg(long)]
    pub json: bool,
    /// Write each item's outcome (choice log-likelihoods, token ids,
    /// generated text) as JSONL to this file.
    #[arg(long)]
    pub per_item: Option<PathBuf>,
    /// Store each suite's result with the repository (needs --repo), where
    /// `switchyard models`, `/admin/models` and quality gates read it.
    #[arg(long, requires = "repo", conflicts_with = "lora")]
    pub save: bool,
    /// A LoRA adapter over the model (a PEFT folder or a llama.cpp GGUF
    /// adapter): the suite measures the adapted model. Its results are not
    /// stored with the repository (--save), which keys them by `model@version`.
    #[arg(long)]
    pub lora: Option<PathBuf>,
    /// Tokens a multiple-choice batch feeds at most.
    #[arg(long, default_value_t = EvalOptions::default().batch_tokens)]
    pub batch_tokens: usize,
    /// Tokens a generation item may produce.
    #[arg(long, default_value_t = EvalOptions::default().max_tokens)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    on_device(
        args.device.device,
        args.device.count(),
        args.device.attention(),
        Eval(args),
    )
}

struct Eval(EvalArgs);

impl OnDevice for Eval {
    type Output = ();

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<()> {
        eval(backend.as_ref(), self.0)
    }
}

fn eval<B: Backend>(backend: &B, args: EvalArgs) -> anyhow::Result<()> {
    // With a repository: the checkpoint's path and its `model@version`.
    let (path, id) = match &args.repo {
        Some(repo) => {
            let repository = switchyard_engine::repository::ModelRepository::open(repo)
                .with_context(|| format!("cannot open the model repository {}", repo.display()))?;
            let (model, version) = repository.resolve(&args.model)?;
            (
                version.path.clone(),
                Some((model.name.clone(), version.version.clone())),
            )
        }
        None => (PathBuf::from(&args.model), None),
    };
    let suites = args
        .suite
        .iter()
        .map(|p| Suite::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    let checkpoint = load_model(&path)?;
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer)
        .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let model = LlamaModel::load(backend, &checkpoint)?;
    let adapter = load_adapter(backend, args.lora.as_deref(), &checkpoint)?;
    let options = EvalOptions {
        batch_tokens: args.batch_tokens.max(1),
        max_tokens: args.max_tokens.max(1),
        ..EvalOptions::default()
    };
    let mut per_item = match &args.per_item {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    for suite in &suites {
        let started = Instant::now();
        let report = evaluate_adapted(
            backend,
            &model,
            adapter.as_ref(),
            &tokenizer,
            suite,
            &options,
        )
        .with_context(|| format!("evaluating {}", suite.path.display()))?;
        let seconds = started.elapsed().as_secs_f64();
        let s = &report.summary;
        if let (true, Some(root), Some((model, version))) = (args.save, &args.repo, &id) {
            let record = QualityRecord {
                model: model.clone(),
                version: version.clone(),
                suite: suite.name(),
                suite_path: std::path::absolute(&suite.path)?,
                suite_hash: suite_hash(&suite.path)
                    .with_context(|| format!("cannot read {}", suite.path.display()))?,
                summary: s.clone(),
                measured_at: now(),
            };
            let saved = record
                .save(root)
                .with_context(|| format!("cannot store the result under {}", root.display()))?;
            eprintln!("stored {}", saved.display());
        }
        if let Some(file) = per_item.as_mut() {
            for item in &report.items {
                let mut line = serde_json::to_value(item)?;
                line["suite"] = json!(suite.name());
                writeln!(file, "{line}")?;
            }
        }
        if args.json {
            let mut value = serde_json::to_value(s)?;
            value["suite"] = json!(suite.name());
            value["model"] = json!(args.model);
            value["lora"] = json!(args.lora.as_ref().map(|p| p.display().to_string()));
            value["seconds"] = json!(seconds);
            value["items_per_s"] = json!(s.n as f64 / seconds.max(1e-9));
            writeln!(out, "{value}")?;
        } else {
            writeln!(
                out,
                "{}: n {} acc {:.3} [{:.3}, {:.3}] acc_norm {:.3} ({:.1}s, {:.1} items/s)",
                suite.name(),
                s.n,
                s.acc,
                s.ci95[0],
                s.ci95[1],
                s.acc_norm,
                seconds,
                s.n as f64 / seconds.max(1e-9)
            )?;
        }
    }
    if let Some(mut file) = per_item {
        file.flush()?;
    }
    Ok(())
}
