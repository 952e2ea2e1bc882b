//! `switchyard demo-repo OUT`: a demo model repository made from the real
//! SmolLM2 model (see `switchyard_engine::repository::demo`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::builder::TypedValueParser;
use indicatif::{ProgressBar, ProgressStyle};
use switchyard_engine::repository::demo::{
    make_demo_repository, DemoEvent, DemoOptions, DEFAULT_DERIVED, MAX_DERIVED,
};

use super::models::human_bytes;

/// The shipped model file, as fetched by scripts/fetch-model.sh.
const DEFAULT_BASE_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes OUT/smollm2/{1,2} (the base, and a Q8_0 re-quantization) and \
                        OUT/smollm2-derived-{a,b,c,…} (base + a seeded low-rank delta: NOT trained \
                        models), with a README.txt saying what each is. List it with \
                        `switchyard models OUT`."
)]
pub struct DemoRepoArgs {
    /// The repository folder to create (or refresh: the same bytes are
    /// written again).
    pub out: PathBuf,
    /// The base GGUF checkpoint (default:
    /// $SWITCHYARD_CACHE or ~/.cache/switchyard, then models/SmolLM2-135M-Instruct.Q4_1.gguf).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// How many derived checkpoints to write (suffixes a, b, c, …; the
    /// first ones are the same bytes whatever the count).
    #[arg(long, default_value_t = DEFAULT_DERIVED,
          value_parser = clap::value_parser!(u8).range(0..=MAX_DERIVED as i64).map(usize::from)
    )]
    pub derived: usize,
}

pub fn run(args: DemoRepoArgs) -> anyhow::Result<()> {
    let base = match args.base {
        Some(path) => path,
        None => default_base()?,
    };
    let options = DemoOptions {
        base,
        out: args.out,
        derived: args.derived,
    };
    let mut reporter = Reporter::default();
    let made =
        make_demo_repository(&options, &mut |event| reporter.on(event)).with_context(|| {
            format!(
                "cannot make the demo repository in {}",
                options.out.display()
            )
        })?;
    eprintln!(
        "demo-repo: wrote {} checkpoints to {}; list them with `switchyard models {}`",
        made.checkpoints.len(),
        made.root.display(),
        made.root.display()
    );
    Ok(())
}

/// The cached SmolLM2 file.
fn default_base() -> anyhow::Result<PathBuf> {
    let cache = match std::env::var_os("SWITCHYARD_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map(|home| Path::new(&home).join(".cache/switchyard"))
            .context("HOME is not set; pass --base PATH or set SWITCHYARD_CACHE")?,
    };
    let path = cache.join("models").join(DEFAULT_BASE_FILE);
    anyhow::ensure!(
        path.is_file(),
        "{} is missing; fetch it with scripts/fetch-model.sh or pass --base PATH",
        path.display()
    );
    Ok(path)
}

/// Turns demo events into log lines and one progress bar per checkpoint.
#[derive(Default)]
struct Reporter {
    bar: Option<ProgressBar>,
}

impl Reporter {
    fn on(&mut self, event: DemoEvent<'_>) {
        match event {
            DemoEvent::Started {
                label,
                path,
                tensors,
            } => {
                eprintln!("demo-repo: {label}: making {}", path.display());
                if tensors > 0 {
                    let bar = ProgressBar::new(tensors as u64);
                    // The template is a constant; a bad one would fall back
                    // to the default style rather than fail the command.
                    if let Ok(style) = ProgressStyle::with_template(
                        "  {prefix} [{bar:30}] {pos}/{len} tensors {elapsed} {wide_msg}",
                    ) {
                        bar.set_style(style.progress_chars("=> "));
                    }
                    bar.set_prefix(label.to_string());
                    self.bar = Some(bar);
                }
            }
            DemoEvent::Tensor { name, .. } => {
                if let Some(bar) = &self.bar {
                    bar.set_message(name.to_string());
                    bar.inc(1);
                }
            }
            DemoEvent::Finished {
                label,
                path,
                bytes,
                how,
            } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                eprintln!(
                    "demo-repo: {label}: {how} {} ({})",
                    path.display(),
                    human_bytes(bytes)
                );
            }
        }
    }
}
