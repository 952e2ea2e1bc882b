//! `switchyard serve`: the OpenAI-compatible HTTP server.
//!
//! Registers every model version in one [`Registry`], loads and activates
//! each model's default version, starts ONE executor thread that batches
//! all of them (swapping the weight table between steps), mounts the
//! router's app over an [`switchyard_engine::Engine`], and serves until
//! SIGTERM/SIGINT, then drains in-flight requests for at most
//! `--drain-seconds`.

mod adapter_admin;
mod admin_error;
mod config;
mod engine_metrics;
#[cfg(test)]
mod kv_type_tests;
mod ledger;
mod lora_metrics;
mod model_admin;
mod policy;
mod pool_metrics;
mod quality_gate;
mod repository;
mod startup;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use switchyard_engine::kv::{default_budget, KvConfig};
use switchyard_engine::registry::Registry;
use switchyard_engine::serving::{Executor, ExecutorConfig};
use switchyard_engine::speculate::Speculation;
use switchyard_engine::Engine;
use switchyard_kernels::kv::{check_block_positions, DEFAULT_BLOCK_POSITIONS};
use switchyard_kernels::{AttentionPrecision, Backend, KvType};
use switchyard_router::{serve_with, shutdown_signal, AppState, RouterConfig, ServeOptions};
use switchyard_seam::InferenceBackend;

use crate::cli::device::{on_device, Device, OnDevice};

use config::{ModelEntry, ServeFile};
use engine_metrics::{ExecutorMetrics, RegistryMetrics};
use repository::{RepositoryWatch, StartupVersion};
use startup::StartupProblems;
use switchyard_router::admin::ModelAdmin;
use switchyard_router::layers::api_key::ApiKeyLayer;

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
    /// A LoRA adapter served as a model of its own over a base (repeat for
    /// several): `NAME=PATH` over the one --model, or `NAME=BASE:PATH` over
    /// the model served as BASE. PATH is a PEFT folder or a llama.cpp GGUF
    /// adapter. Requests name it in `model` (`NAME` or `NAME@1`); its rows
    /// share every step with the base's.
    #[arg(long = "lora", value_name = "NAME=[BASE:]PATH")]
    pub loras: Vec<String>,
    /// The chat template for the --model at the same position (repeat as
    /// --model): a known template's name (chatml, gemma), a Jinja file, or
    /// `auto` [default: auto: the file's own template, else its family's
    /// (Gemma's for Gemma), else ChatML; startup says which].
    #[arg(long = "chat-template")]
    pub chat_templates: Vec<String>,
    /// The context window of the --model at the same position (repeat as
    /// --model): positions a request may use, prompt and output together, at
    /// most the model's trained context [default: the trained context].
    #[arg(long = "ctx-size")]
    pub ctx_sizes: Vec<usize>,
    /// A draft model for the --model at the same position (repeat as
    /// --model): a smaller GGUF file or Hugging Face folder of the same
    /// tokenizer whose greedy tokens the model verifies (speculative
    /// decoding, see --speculate; the output is the model's own).
    #[arg(long = "draft-model", value_name = "PATH")]
    pub draft_models: Vec<PathBuf>,
    /// An API key clients must send as `Authorization: Bearer KEY` on /v1/
    /// requests (repeat for several); for deployments without tenants (a
    /// --policy gives tenants their own keys). Probes and /metrics stay open.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// A model repository to serve: REPO/<model>/<version>/ holding a GGUF
    /// file or a Hugging Face folder, with an optional REPO/<model>/model.toml
    /// (aliases, default version, version policy). Each model's served
    /// versions are loaded and its default version is active; the admin API
    /// loads, activates, rolls back and unloads versions. Replaces --model.
    #[arg(long, conflicts_with = "models")]
    pub repo: Option<PathBuf>,
    /// RAM for resident checkpoint tensors, in MiB (shared tensors counted
    /// once); loading beyond it evicts idle non-active versions [default: no limit].
    #[arg(long)]
    pub ram_budget_mb: Option<u64>,
    /// MiB for resident LoRA adapters (their A and B matrices): loading one
    /// past it evicts the least recently used adapters no request is using;
    /// a request for an evicted adapter loads it again [default: no limit].
    #[arg(long)]
    pub lora_budget_mb: Option<u64>,
    /// Where the kernels run: cpu, or cuda[:N] (GPU N; a build with
    /// `--features cuda`) [default: cpu].
    #[arg(long)]
    pub device: Option<Device>,
    /// Kernel worker threads [default: every core].
    #[arg(long)]
    pub threads: Option<usize>,
    /// How KV caches store keys and values: f16, f32 or q8_0 (int8 in
    /// groups of 32 with f16 scales, as llama.cpp's `-ctk q8_0 -ctv q8_0`;
    /// needs a head_dim that is a multiple of 32) [default: f16].
    #[arg(long)]
    pub kv_type: Option<KvType>,
    /// Attention's products (queries·keys, probabilities·values): f32;
    /// bf16 (inputs rounded to BF16, f32 accumulation; AVX-512 BF16's
    /// `vdpbf16ps`, and AMX tiles for prompt rows, where the CPU has
    /// them); bf16-prompt (BF16 on AMX tiles for every prompt row, in
    /// any chunk, f32 for decode and verify rows and on CPUs without AMX);
    /// or bf16x3 (bf16-prompt's rows with each operand split in two BF16
    /// parts, three products summed: close to f32's results at AMX speed)
    /// [default: f32: BF16 moves every prompt's logits (greedy output can
    /// change at near-ties) and AMX hosts would answer otherwise than the
    /// rest; bf16-prompt keeps decode's f32 speed and the prompt cache's
    /// exactness and speeds prompts at 1k-32k tokens of context on an AMX
    /// host; docs/ATTENTION_PRECISION.md].
    #[arg(long)]
    pub attention_precision: Option<AttentionPrecision>,
    /// Positions per KV block, a multiple of 32: the unit KV memory is
    /// allocated in and the prompt cache shares. Larger blocks read faster
    /// at long contexts; smaller ones share prompt prefixes more finely and
    /// take less memory per short sequence [default: 1024].
    #[arg(long, value_parser = kv_block)]
    pub kv_block: Option<usize>,
    /// MiB all KV caches may reserve together; a request whose cache
    /// (prompt + max_tokens, or the whole context without max_tokens)
    /// cannot fit is refused, one that fits waits for running sequences
    /// to end [default: half the memory available at startup].
    #[arg(long)]
    pub kv_budget_mb: Option<u64>,
    /// Sequences running at once over all models (each holds a KV cache) [default: 64].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// HTTP requests waiting for a slot (beyond the batch) before the
    /// server answers 429 with Retry-After [default: 256].
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Tokens one forward step runs at most (prompt chunks and decode rows) [default: 256];
    /// from a sixteenth of it in decode rows, a step runs at most a quarter of it.
    #[arg(long)]
    pub max_step_tokens: Option<usize>,
    /// Turn off the prompt cache (on by default: full 32-token blocks of
    /// prompts stay in the KV budget after their request and serve later
    /// prompts of the same weights that start the same; evicted least
    /// recently used when the budget needs room).
    #[arg(long)]
    pub no_prompt_cache: bool,
    #[command(flatten)]
    pub speculate: crate::cli::speculate::SpeculateArgs,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT [default: 30].
    #[arg(long)]
    pub drain_seconds: Option<u64>,
    /// A web origin (`https://app.example`, as browsers send it) whose pages
    /// may call the API, with CORS headers; repeat for several, `*` for any.
    /// A request carrying any other `Origin` header is refused with 403
    /// [default: none: no browser page may call the API].
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Seconds a client may leave a response unread (its socket not taking
    /// bytes) before the connection is closed, which cancels its generation
    /// and frees its slot and KV cache [default: 30].
    #[arg(long)]
    pub write_timeout_secs: Option<u64>,
    /// A TOML settings file with the same keys (listen, threads, max_batch,
    /// max_queue, max_step_tokens, drain_seconds, ram_budget_mb, repo,
    /// [[models]] path/name/version); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start even when some configured models do not load (a bad --model
    /// path, a model.toml typo) or the policy names checkpoints that are not
    /// served; the console and GET /ready list what is missing. Without it,
    /// any such problem stops the server with every problem listed.
    #[arg(long)]
    pub allow_partial_start: bool,
    #[command(flatten)]
    pub policy: policy::PolicyFlags,
}

/// Settings after the file and the flags are merged.
struct Settings {
    listen: SocketAddr,
    device: Device,
    threads: usize,
    attention: AttentionPrecision,
    executor: ExecutorConfig,
    /// HTTP requests allowed to wait for an in-flight slot.
    max_queue: usize,
    drain: Duration,
    ram_budget: Option<u64>,
    lora_budget: Option<u64>,
    repo: Option<PathBuf>,
    models: Vec<ModelEntry>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let allow_partial = args.allow_partial_start;
    let api_keys = api_keys(&args)?;
    let mut problems = StartupProblems::default();
    let policy = match policy::PolicySetup::load(&args.policy) {
        Ok(policy) => Some(policy),
        Err(error) => {
            problems.push_fatal(format!("{error:#}"));
            None
        }
    };
    let allowed_origins = args.allow_origins.clone();
    let write_timeout = args
        .write_timeout_secs
        .map_or(ServeOptions::default().write_timeout, Duration::from_secs);
    let settings = settings(args)?;
    if let (Some(store), Some(root)) = (policy.as_ref().and_then(|p| p.store()), &settings.repo) {
        // `quality_from` reads the measurements stored with the repository, at load and
        // whenever one is stored (a gate's run, `eval --save`).
        if let Err(error) =
            store.set_quality_source(Arc::new(crate::cli::quality::RepoQuality::new(root)))
        {
            problems.push_fatal(format!("{error:#}"));
        }
    }
    // The port first: a port in use is said at once, not after the models load.
    let listener = std::net::TcpListener::bind(settings.listen)
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    listener
        .set_nonblocking(true)
        .context("cannot make the listening socket non-blocking")?;
    // The recorder first: what the engine records while it loads (load
    // durations, resident bytes, active versions) would otherwise be lost.
    let _ = switchyard_router::metrics::Metrics::global();
    let started = StartEngine {
        settings: &settings,
        policy: policy.as_ref(),
        problems: &mut problems,
    };
    let (backend, model_admin) = on_device(
        settings.device,
        settings.threads,
        settings.attention,
        started,
    )?;
    let missing = problems.finish(allow_partial)?;
    let Some(policy) = policy else {
        anyhow::bail!("the policy did not load");
    };
    let router_config = RouterConfig {
        // HTTP requests past the batch and the queue are shed by the router
        // with 429 + Retry-After; the engine's own queue (sized to hold all
        // of them, see `settings`) then only refuses large `n` fan-outs.
        max_in_flight: settings.executor.max_active + settings.max_queue,
        max_queued: settings.max_queue,
        missing_at_startup: missing,
        allowed_origins,
        ..RouterConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let address = listener.local_addr().unwrap_or(settings.listen);
        crate::cli::console::info(&format!(
            "switchyard: serving OpenAI-compatible API on http://{address}/v1"
        ));
        let admin = policy
            .spawn_admin(Some(model_admin), settings.drain)
            .await?;
        let state = AppState::new(backend.clone(), router_config);
        let app = policy.app(state, backend);
        let app = match api_keys {
            Some(keys) => app.layer(keys),
            None => app,
        };
        let options = ServeOptions {
            drain_deadline: settings.drain,
            write_timeout,
            ..ServeOptions::default()
        };
        serve_with(listener, app, shutdown_signal(), options)
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
    crate::cli::console::info("switchyard: stopped");
    Ok(())
}

fn settings(args: ServeArgs) -> anyhow::Result<Settings> {
    let file = match &args.config {
        Some(path) => ServeFile::read(path)?,
        None => ServeFile::default(),
    };
    let kv = kv_config(&args, &file)?;
    if args.model_names.len() > args.models.len() {
        anyhow::bail!(
            "{} --model-name flags but {} --model flags; give each name after its --model",
            args.model_names.len(),
            args.models.len()
        );
    }
    for (flag, count) in [
        ("--chat-template", args.chat_templates.len()),
        ("--ctx-size", args.ctx_sizes.len()),
        ("--draft-model", args.draft_models.len()),
    ] {
        if count > args.models.len().max(1) {
            anyhow::bail!(
                "{count} {flag} flags but {} --model flags; give each {flag} after its --model",
                args.models.len()
            );
        }
    }
    let mut models: Vec<ModelEntry> = args
        .models
        .iter()
        .enumerate()
        .map(|(i, path)| ModelEntry {
            path: path.clone(),
            name: args.model_names.get(i).cloned(),
            version: None,
            chat_template: args.chat_templates.get(i).cloned(),
            ctx_size: args.ctx_sizes.get(i).copied(),
            adapter: None,
            parent: None,
            draft: args.draft_models.get(i).cloned(),
        })
        .collect();
    if models.is_empty() {
        models = file.models;
    }
    let repo = args.repo.clone().or(file.repo.clone());
    if models.is_empty() && repo.is_none() {
        models.push(ModelEntry {
            path: default_model()?,
            name: None,
            version: None,
            chat_template: args.chat_templates.first().cloned(),
            ctx_size: args.ctx_sizes.first().copied(),
            adapter: None,
            parent: None,
            draft: args.draft_models.first().cloned(),
        });
    }
    let speculation = args.speculate.speculation()?;
    if matches!(speculation, Speculation::Draft { .. })
        && repo.is_none()
        && models.iter().all(|m| m.draft.is_none())
    {
        anyhow::bail!("--speculate draft needs a --draft-model (or a model entry's `draft`)");
    }
    for spec in &args.loras {
        let entry = ModelEntry::lora(spec, &models)?;
        models.push(entry);
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
        device: args.device.or(file.device).unwrap_or_default(),
        threads,
        attention: args
            .attention_precision
            .or(file.attention_precision)
            .unwrap_or_default(),
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
            prompt_cache: !args.no_prompt_cache,
            kv,
            speculation,
        },
        max_queue,
        drain: Duration::from_secs(args.drain_seconds.or(file.drain_seconds).unwrap_or(30)),
        ram_budget: args
            .ram_budget_mb
            .or(file.ram_budget_mb)
            .map(|mb| mb.saturating_mul(1024 * 1024)),
        lora_budget: args
            .lora_budget_mb
            .or(file.lora_budget_mb)
            .map(|mb| mb.saturating_mul(1024 * 1024)),
        repo,
        models,
    })
}

/// The KV settings from the flags, then the file, then the defaults.
fn kv_config(args: &ServeArgs, file: &ServeFile) -> anyhow::Result<KvConfig> {
    Ok(KvConfig {
        dtype: args.kv_type.or(file.kv_type).unwrap_or_default(),
        block_positions: args
            .kv_block
            .or(file.kv_block)
            .map(check_block_positions)
            .transpose()
            .map_err(anyhow::Error::msg)?
            .unwrap_or(DEFAULT_BLOCK_POSITIONS),
        budget_bytes: args
            .kv_budget_mb
            .or(file.kv_budget_mb)
            .map_or_else(default_budget, |mb| {
                usize::try_from(mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX)
            }),
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
    crate::cli::console::info(&format!(
        "switchyard: {} is missing; fetching it with {}",
        cached.display(),
        script.display()
    ));
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

/// The engine on the backend `--device` chose, as the router and the
/// admin API see it.
struct StartEngine<'a> {
    settings: &'a Settings,
    /// The policy, whose model names are checked against what loaded.
    policy: Option<&'a policy::PolicySetup>,
    problems: &'a mut StartupProblems,
}

type Started = (Arc<dyn InferenceBackend>, Arc<dyn ModelAdmin>);

impl OnDevice for StartEngine<'_> {
    type Output = Started;

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<Started> {
        let (engine, repository) = start_engine(backend, self.settings, self.problems)?;
        if let Some(store) = self.policy.and_then(policy::PolicySetup::store) {
            if let Some(path) = store.path() {
                let served = engine.registry().status();
                for problem in startup::policy_names_not_served(&store.current(), path, &served) {
                    self.problems.push(problem);
                }
            }
        }
        let engine = Arc::new(engine);
        switchyard_router::metrics::add_scrape_source(Arc::new(pool_metrics::PoolMetrics::new(
            engine.clone(),
        )));
        switchyard_router::metrics::add_scrape_source(Arc::new(lora_metrics::LoraMetrics::new(
            engine.clone(),
        )));
        let admin = Arc::new(model_admin::EngineAdmin::new(engine.clone(), repository));
        Ok((engine, admin))
    }
}

/// The registry with every configured version loaded and each model's
/// version activated, and the executor that runs them all.
fn start_engine<B: Backend>(
    backend: Arc<B>,
    settings: &Settings,
    problems: &mut StartupProblems,
) -> anyhow::Result<(Engine<B>, Option<RepositoryWatch>)> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let kv = settings.executor.kv;
    crate::cli::console::info(&format!(
        "switchyard: {} backend; KV caches in {}, blocks of {} positions, budget {:.0} MiB",
        backend.name(),
        kv.dtype,
        kv.block_positions,
        kv.budget_bytes as f64 / (1024.0 * 1024.0)
    ));
    let kv_format = switchyard_kernels::KvFormat::new(kv.dtype, kv.block_positions);
    let registry_metrics = RegistryMetrics::new();
    let registry = Arc::new(
        Registry::new(backend.clone(), settings.ram_budget)
            .with_adapter_budget(settings.lora_budget)
            .with_kv_format(kv_format)
            .with_observer(registry_metrics.clone()),
    );
    registry_metrics.attach(&registry);
    let (startup, repository) = match &settings.repo {
        Some(root) => {
            let (watch, startup, skipped) = RepositoryWatch::open(root, &registry)?;
            for problem in skipped {
                problems.push(problem);
            }
            (startup, Some(watch))
        }
        None => (register_files(&settings.models, &registry)?, None),
    };
    load_startup(&registry, &startup, problems)?;
    let executor = Executor::spawn(
        backend,
        settings.executor.clone(),
        Arc::new(ExecutorMetrics::default()),
    )
    .context("cannot start the executor thread")?;
    let engine = Engine::new(registry, executor, created);
    Ok((engine, repository))
}

/// Loads the startup versions: each model's default first, activated as soon as it is
/// loaded (so that later loads under a RAM budget cannot evict a version about to be
/// activated), then the others. A version that fails to load is a startup problem; a
/// model whose default failed gets its newest version that loaded (when the operator
/// allows a partial start). Nothing loaded at all is fatal.
fn load_startup<B: Backend>(
    registry: &Registry<B>,
    startup: &[StartupVersion],
    problems: &mut StartupProblems,
) -> anyhow::Result<()> {
    let defaults = startup.iter().filter(|v| v.activate);
    let others = startup.iter().filter(|v| !v.activate);
    let mut loaded: Vec<&StartupVersion> = Vec::new();
    for version in defaults.chain(others) {
        let (name, number) = (&version.model, &version.version);
        match registry.load(name, number) {
            Ok(report) => {
                crate::cli::console::info(&format!(
                    "switchyard: loaded `{name}@{number}` in {:.0} ms ({:.1} MB, {:.1} MB shared); \
                     chat template: {}",
                    report.elapsed.as_secs_f64() * 1e3,
                    report.bytes as f64 / 1e6,
                    report.shared_bytes as f64 / 1e6,
                    report.template
                ));
                if version.activate {
                    registry
                        .activate(name, number)
                        .with_context(|| format!("cannot activate `{name}@{number}`"))?;
                }
                loaded.push(version);
            }
            // The registry's message names the checkpoint and the file.
            Err(error) => problems.push(error.to_string()),
        }
    }
    if loaded.is_empty() {
        problems.nothing_to_serve();
        return Ok(());
    }
    for failed in startup.iter().filter(|v| v.activate) {
        let name = &failed.model;
        if loaded.iter().any(|v| v.model == *name && v.activate) {
            continue;
        }
        // `startup` lists a model's versions oldest first; a model none of whose
        // versions loaded has each failure listed already.
        if let Some(stand_in) = loaded.iter().rev().find(|v| v.model == *name) {
            registry
                .activate(name, &stand_in.version)
                .with_context(|| format!("cannot activate `{name}@{}`", stand_in.version))?;
            problems.push(format!(
                "`{name}@{}` is active instead of the default `{name}@{}`, which did not load",
                stand_in.version, failed.version
            ));
        }
    }
    Ok(())
}

/// Registers `--model` files (or the settings file's `[[models]]`): each
/// is version "1" of its name unless it says otherwise; the last version
/// listed for a name becomes active.
fn register_files<B: Backend>(
    models: &[ModelEntry],
    registry: &Registry<B>,
) -> anyhow::Result<Vec<StartupVersion>> {
    let mut startup: Vec<StartupVersion> = Vec::new();
    for entry in models {
        let name = entry.served_name();
        let version = entry.version.clone().unwrap_or_else(|| "1".to_owned());
        if startup
            .iter()
            .any(|v| v.model == name && v.version == version)
        {
            anyhow::bail!(
                "two models are named `{name}@{version}`; give them distinct --model-name values"
            );
        }
        registry.register(&name, &version, &entry.path, &[]);
        registry.configure(&name, entry.options());
        for earlier in startup.iter_mut().filter(|v| v.model == name) {
            earlier.activate = false;
        }
        startup.push(StartupVersion {
            model: name,
            version,
            activate: true,
        });
    }
    Ok(startup)
}

/// `--api-key`s as a layer; refused beside a policy, whose tenants have keys of their own.
fn api_keys(args: &ServeArgs) -> anyhow::Result<Option<ApiKeyLayer>> {
    if args.api_keys.is_empty() {
        return Ok(None);
    }
    if args.policy.policy.is_some() {
        anyhow::bail!(
            "--api-key is for deployments without tenants; with --policy, give each tenant \
             its keys in the policy file"
        );
    }
    let keys: Vec<String> = args.api_keys.iter().map(|k| k.trim().to_owned()).collect();
    if keys.iter().any(String::is_empty) {
        anyhow::bail!(
            "--api-key is empty; give a key such as the output of `openssl rand -hex 16`"
        );
    }
    crate::cli::console::info(&format!(
        "switchyard: /v1/ requests need one of {} API key(s) (Authorization: Bearer KEY)",
        keys.len()
    ));
    Ok(Some(ApiKeyLayer::new(keys)))
}

/// `--kv-block`: a number of positions the KV caches can use.
fn kv_block(arg: &str) -> Result<usize, String> {
    let positions = arg
        .parse()
        .map_err(|_| format!("{arg:?} is not a number of positions"))?;
    check_block_positions(positions)
}
