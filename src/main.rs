//! `switchyard`: the command-line program.

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Serve many LLM checkpoints from one shared engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: cli::logging::LogArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(cli::generate::GenerateArgs),
    /// Print the token ids a checkpoint's tokenizer gives for texts (JSON).
    Tokenize(cli::tokenize::TokenizeArgs),
    /// Run the forward pass on token ids and write logits (for numerical checks).
    Logits(cli::logits::LogitsArgs),
    /// Serve the OpenAI-compatible HTTP API (continuous batching).
    Serve(Box<cli::serve::ServeArgs>),
    /// Write a small deterministic synthetic checkpoint (for tests).
    Synth(cli::synth::SynthArgs),
    /// Check a routing policy file, or explain how it routes a request.
    Policy(cli::policy::PolicyArgs),
    /// List the models and versions of a model repository.
    Models(cli::models::ModelsArgs),
    /// Run evaluation suites (JSONL) on a checkpoint: accuracy with a 95% interval.
    Eval(cli::eval::EvalArgs),
    /// Set a cascade's `min_confidence` from measured answers (a running server's, or a file's).
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Make a demo model repository from the SmolLM2 model (base, Q8_0, derived).
    DemoRepo(cli::demo_repo::DemoRepoArgs),
    /// Write a draft model for speculative decoding: some of a model's own layers.
    LayerDraft(cli::layer_draft::LayerDraftArgs),
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            cli::console::error(&cli::report::error_text(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli::logging::init(&cli.log)?;
    cli::console::set_format(cli.log.log_format);
    match cli.command {
        Command::Generate(args) => cli::generate::run(args),
        Command::Tokenize(args) => cli::tokenize::run(args),
        Command::Logits(args) => cli::logits::run(args),
        Command::Synth(args) => cli::synth::run(args),
        Command::Policy(args) => cli::policy::run(args),
        Command::Serve(args) => cli::serve::run(*args),
        Command::Models(args) => cli::models::run(args),
        Command::DemoRepo(args) => cli::demo_repo::run(args),
        Command::LayerDraft(args) => cli::layer_draft::run(args),
        Command::Eval(args) => cli::eval::run(args),
        Command::Calibrate(args) => cli::calibrate::run(args),
    }
}
