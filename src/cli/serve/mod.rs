//! `switchyard serve`: the OpenAI-compatible HTTP server.
//!
//! Loads each model with its own executor thread (continuous batching),
//! mounts the router's app over an [`engine_backend::EngineBackend`], and
//! serves until SIGTERM/SIGINT, then drains in-flight requests for at most
//! `--drain-seconds`.

mod config;
mod engine_backend;
mod policy;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use switchyard_engine::chat::ChatTemplate;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::serving::{Executor, ExecutorConfig};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_router::{serve_with_drain_deadline, shutdown_signal, AppState, RouterConfig};

use config::{ModelEntry, ServeFile};
use engine_backend::{EngineBackend, ServedModel};

/// The model served when none is named (fetched by `scripts/fetch-model.sh`).
const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A checkpoint to serve (GGUF file or Hugging Face folder); repeat for
    /// several. Default: SmolLM2-135M-Instruct Q4_1, fetched once into
    /// ~/.cache/switchyard/models.
    #[arg(long = "model")]
    pub models: Vec<PathBuf>,
    /// The name clients use for the --model at the same position (repeat
    /// as --model); default: the file stem.
    #[arg(long = "model-name")]
    pub model_names: Vec<String>,
    /// Kernel worker threads per model [default: every core].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences batched together per model [default: 64].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// HTTP requests waiting for a slot (beyond the batch) before the
    /// server answers 429 with Retry-After [default: 256].
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Tokens one forward step runs at most (prompt chunks and decode rows) [default: 256].
    #[arg(long)]
    pub max_step_tokens: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT [default: 30].
    #[arg(long)]
    pub drain_seconds: Option<u64>,
    /// A TOML settings file with the same keys (listen, threads, max_batch,
    /// max_queue, max_step_tokens, drain_seconds, [[models]] path/name);
    /// flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub policy: policy::PolicyFlags,
}

/// Settings after the file and the flags are merged.
struct Settings {
    listen: SocketAddr,
    threads: usize,
    executor: ExecutorConfig,
    /// HTTP requests allowed to wait for an in-flight slot.
    max_queue: usize,
    drain: Duration,
    models: Vec<ModelEntry>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let policy = policy::PolicySetup::load(&args.policy)?;
    let settings = settings(args)?;
    let backend = Arc::new(EngineBackend::new(load_models(&settings)?));
    let router_config = RouterConfig {
        // HTTP requests past the batch and the queue are shed by the router
        // with 429 + Retry-After; the engine's own queue (sized to hold all
        // of them, see `settings`) then only refuses large `n` fan-outs.
        max_in_flight: settings.executor.max_active + settings.max_queue,
        max_queued: settings.max_queue,
        ..RouterConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let address = listener.local_addr().unwrap_or(settings.listen);
        eprintln!("switchyard: serving OpenAI-compatible API on http://{address}/v1");
        // lead: engine adapter — pass the engine's `ModelAdmin` here instead of `None`.
        let admin = policy.spawn_admin(None, settings.drain).await?;
        let state = AppState::new(backend.clone(), router_config);
        let app = policy.app(state, backend);
        serve_with_drain_deadline(listener, app, shutdown_signal(), settings.drain)
            .await
            .context("serving failed")?;
        if let Some(admin) = admin {
            admin
                .await
                .context("the admin API task failed")?
                .context("the admin API failed")?;
        }
        anyhow::Ok(())
    })?;
    eprintln!("switchyard: stopped");
    Ok(())
}

fn settings(args: ServeArgs) -> anyhow::Result<Settings> {
    let file = match &args.config {
        Some(path) => ServeFile::read(path)?,
        None => ServeFile::default(),
    };
    if args.model_names.len() > args.models.len() {
        anyhow::bail!(
            "{} --model-name flags but {} --model flags; give each name after its --model",
            args.model_names.len(),
            args.models.len()
        );
    }
    let mut models: Vec<ModelEntry> = args
        .models
        .iter()
        .enumerate()
        .map(|(i, path)| ModelEntry {
            path: path.clone(),
            name: args.model_names.get(i).cloned(),
        })
        .collect();
    if models.is_empty() {
        models = file.models;
    }
    if models.is_empty() {
        models.push(ModelEntry {
            path: default_model()?,
            name: None,
        });
    }
    let defaults = ExecutorConfig::default();
    let max_active = args
        .max_batch
        .or(file.max_batch)
        .unwrap_or(defaults.max_active)
        .max(1);
    let max_queue = args
        .max_queue
        .or(file.max_queue)
        .unwrap_or(defaults.max_queued);
    let threads = args
        .threads
        .or(file.threads)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    Ok(Settings {
        listen: args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
        threads,
        executor: ExecutorConfig {
            max_active,
            // Room for every request the router lets in, so that the
            // router's 429 is what a client normally sees under overload.
            max_queued: max_active + max_queue,
            max_step_tokens: args
                .max_step_tokens
                .or(file.max_step_tokens)
                .unwrap_or(defaults.max_step_tokens)
                .max(1),
        },
        max_queue,
        drain: Duration::from_secs(args.drain_seconds.or(file.drain_seconds).unwrap_or(30)),
        models,
    })
}

/// The cached SmolLM2 file, fetched with `scripts/fetch-model.sh` when missing.
fn default_model() -> anyhow::Result<PathBuf> {
    let cache = match std::env::var_os("SWITCHYARD_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map(|home| Path::new(&home).join(".cache/switchyard"))
            .context("HOME is not set; pass --model PATH or set SWITCHYARD_CACHE")?,
    };
    let cached = cache.join("models").join(DEFAULT_MODEL_FILE);
    if cached.is_file() {
        return Ok(cached);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-model.sh");
    eprintln!(
        "switchyard: {} is missing; fetching it with {}",
        cached.display(),
        script.display()
    );
    let output = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}; pass --model PATH instead", script.display()))?;
    if !output.status.success() {
        anyhow::bail!(
            "{} failed ({}); pass --model PATH to serve a local checkpoint",
            script.display(),
            output.status
        );
    }
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !path.is_file() {
        anyhow::bail!(
            "{} printed {}, which is not a file",
            script.display(),
            path.display()
        );
    }
    Ok(path)
}

fn load_models(settings: &Settings) -> anyhow::Result<Vec<ServedModel>> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut served = Vec::with_capacity(settings.models.len());
    for entry in &settings.models {
        let name = entry.served_name();
        if served.iter().any(|m: &ServedModel| m.name == name) {
            anyhow::bail!("two models are named `{name}`; give them distinct --model-name values");
        }
        let path = &entry.path;
        let checkpoint =
            load_checkpoint(path).with_context(|| format!("cannot load {}", path.display()))?;
        let tokenizer = Tokenizer::load(&checkpoint.tokenizer)
            .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
        let template = ChatTemplate::new_or_default(tokenizer.chat_template())
            .with_context(|| format!("the chat template of {} is unusable", path.display()))?;
        let backend = Arc::new(CpuBackend::new(settings.threads));
        let model = Arc::new(
            LlamaModel::load(backend.as_ref(), &checkpoint)
                .with_context(|| format!("cannot load the weights of {}", path.display()))?,
        );
        drop(checkpoint);
        let gauge_name = name.clone();
        let observer = Arc::new(move |depth: usize| {
            switchyard_router::metrics::set_queue_depth(&gauge_name, depth);
        });
        let executor = Executor::spawn(backend, model, settings.executor.clone(), observer)
            .context("cannot start the executor thread")?;
        eprintln!("switchyard: loaded `{name}` from {}", path.display());
        served.push(ServedModel {
            name,
            created,
            tokenizer,
            template,
            executor,
        });
    }
    Ok(served)
}
