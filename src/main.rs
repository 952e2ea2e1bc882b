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
    /// Make a demo model repository from the SmolLM2 model (base, Q8_0, derived).
    DemoRepo(cli::demo_repo::DemoRepoArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate(args) => cli::generate::run(args),
        Command::Tokenize(args) => cli::tokenize::run(args),
        Command::Logits(args) => cli::logits::run(args),
        Command::Synth(args) => cli::synth::run(args),
        Command::Policy(args) => cli::policy::run(args),
        Command::Serve(args) => cli::serve::run(*args),
        Command::Models(args) => cli::models::run(args),
        Command::DemoRepo(args) => cli::demo_repo::run(args),
    }
}
