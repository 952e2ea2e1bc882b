//! A checkpoint version ready to serve: its weight table, tokenizer and
//! chat template, and the live counters the scheduler and eviction read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use switchyard_kernels::{Backend, KvFormat, KvPrefix, WeightTier};

use crate::adapter::{load_adapter, ResidentAdapter};
use crate::chat::ChatTemplate;
use crate::chat_choice::{self, TemplateOrigin, TemplateSpec};
use crate::formats::{load_checkpoint, CheckpointFormat};
use crate::model::config::ModelConfig;
use crate::model::weights::LoadStats;
use crate::model::{LlamaModel, LogitRows, SequenceChunk};
use crate::speculate::DraftModel;
use crate::store::WeightStore;
use crate::structured::GrammarVocab;
use crate::tokenizer::Tokenizer;

/// Which checkpoint: a model name and one of its versions (the seam's type,
/// under the name the engine has always used for it).
pub use switchyard_seam::CheckpointRef as CheckpointId;

/// How the operator asked a model's checkpoints to be served (`--chat-template`,
/// `model.toml`); the same for every version of a model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// The chat template instead of the file's own.
    pub chat_template: Option<TemplateSpec>,
    /// Positions a sequence may use (prompt and output), at most the
    /// trained context: a smaller window bounds each request's KV cache.
    pub ctx_size: Option<usize>,
    /// A LoRA adapter served over the checkpoint's weights (which it shares
    /// with the base through the weight store).
    pub adapter: Option<AdapterSource>,
    /// A smaller checkpoint of the same tokenizer that drafts tokens for
    /// speculative decoding (`--draft-model`; `crate::speculate`).
    pub draft: Option<PathBuf>,
}

/// Where a served adapter comes from, and the model it was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSource {
    /// A PEFT folder or a llama.cpp GGUF adapter.
    pub path: PathBuf,
    /// The served name of its base model (`/v1/models`' `parent`).
    pub parent: String,
}

impl CheckpointOptions {
    /// `config` with the context window the options ask for.
    pub fn apply(&self, config: &mut ModelConfig) -> Result<(), String> {
        let Some(ctx) = self.ctx_size else {
            return Ok(());
        };
        if ctx == 0 || ctx > config.context_length {
            return Err(format!(
                "a context size (--ctx-size, ctx_size) of {ctx} is outside 1..={}, the model's trained context; give a \
                 size in that range",
                config.context_length
            ));
        }
        config.context_length = ctx;
        Ok(())
    }
}

/// Why a checkpoint could not be made servable. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The format error names the file itself (`cannot read P: ...`).
    #[error("{reason}")]
    Format { path: PathBuf, reason: String },
    #[error("cannot load the tokenizer of {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("the chat template of {path} is unusable: {reason}")]
    Template { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Options { path: PathBuf, reason: String },
    #[error("cannot use {path} as a draft model: {reason}")]
    Draft { path: PathBuf, reason: String },
    #[error("cannot load the adapter {path}: {reason}")]
    Adapter { path: PathBuf, reason: String },
    #[error("cannot load the weights of {path}: {reason}")]
    Weights { path: PathBuf, reason: String },
    #[error(
        "the smoke forward of {path} failed: {reason}; the checkpoint is corrupt or its \
         configuration does not match its tensors"
    )]
    Smoke { path: PathBuf, reason: String },
}

/// A loaded checkpoint version. Shared (`Arc`) by the registry, the
/// executor and every sequence running on it, so a version that is
/// unloaded while it serves finishes its sequences first.
pub struct ServedCheckpoint<B: Backend> {
    pub id: CheckpointId,
    /// The weight table: handles into the shared [`WeightStore`].
    pub model: LlamaModel<B>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Where `template` came from (said at startup and by the admin API).
    pub template_origin: TemplateOrigin,
    /// The vocabulary as the grammar engine reads it, built on the first
    /// constrained request.
    pub grammar_vocab: GrammarVocab,
    pub source: PathBuf,
    pub format: CheckpointFormat,
    /// Its tensor types (see [`crate::formats::quant_mix`]), when loaded
    /// from a file.
    pub quant_mix: Option<String>,
    /// Bytes of its tensors, and how many were shared with other checkpoints.
    pub load_stats: LoadStats,
    /// How long reading, storing and checking it took.
    pub load_time: Duration,
    /// What its KV depends on (`LlamaModel::weight_identity`): the prompt
    /// cache's key, so versions with equal weights share cached prefixes.
    pub weight_identity: u64,
    /// Whether the prompt cache serves it (not with sliding-window layers).
    pub caches_prompts: bool,
    /// The LoRA adapter this version serves over its base, and the base's
    /// served name.
    pub adapter: Option<ResidentAdapter<B>>,
    pub parent: Option<String>,
    /// The model that drafts tokens for it (`crate::speculate`), if any.
    pub draft: Option<DraftModel<B>>,
    /// Requests submitted and not finished (waiting or running).
    demand: AtomicUsize,
    /// Requests waiting for a batch slot.
    queued: AtomicUsize,
    /// Milliseconds since [`epoch`] when a request last used it.
    last_used_ms: AtomicU64,
    /// Where the backend holds its matrices, as last seen (see
    /// [`ServedCheckpoint::placement`]).
    placement: AtomicU8,
}

impl<B: Backend> ServedCheckpoint<B> {
    /// The prompt cache's key of its sequences.
    pub fn cache_key(&self) -> crate::kv::CacheKey {
        crate::kv::CacheKey {
            adapter: self.adapter.as_ref().map(ResidentAdapter::identity),
            ..crate::kv::CacheKey::weights(self.weight_identity)
        }
    }

    /// Reads `path` (GGUF file or Hugging Face folder), stores its tensors
    /// through `store` and runs a smoke forward with a KV cache of
    /// `kv_format`: one short prompt whose logits must all be finite. A KV
    /// type that cannot hold the model's heads (Q8_0 needs a head_dim that
    /// is a multiple of 32) fails here, naming it, rather than every
    /// request later.
    pub fn load(
        backend: &B,
        store: &WeightStore<B>,
        id: CheckpointId,
        path: &Path,
        options: &CheckpointOptions,
        kv_format: KvFormat,
    ) -> Result<Self, CheckpointError> {
        let started = Instant::now();
        let fail = |reason: String| (path.to_path_buf(), reason);
        let mut checkpoint = load_checkpoint(path).map_err(|e| {
            let (path, reason) = fail(e.to_string());
            CheckpointError::Format { path, reason }
        })?;
        options.apply(&mut checkpoint.config).map_err(|reason| {
            let (path, reason) = fail(reason);
            CheckpointError::Options { path, reason }
        })?;
        let tokenizer = Tokenizer::load(&checkpoint.tokenizer).map_err(|e| {
            let (path, reason) = fail(e.to_string());
            CheckpointError::Tokenizer { path, reason }
        })?;
        let (template, template_origin) = chat_choice::choose(
            options.chat_template.as_ref(),
            &tokenizer,
            Some(checkpoint.config.architecture),
        )
        .map_err(|e| {
            let (path, reason) = fail(e.to_string());
            CheckpointError::Template { path, reason }
        })?;
        let (model, load_stats) =
            LlamaModel::load_shared(backend, &checkpoint, store).map_err(|e| {
                let (path, reason) = fail(e.to_string());
                CheckpointError::Weights { path, reason }
            })?;
        let adapter = match &options.adapter {
            None => None,
            Some(source) => {
                let fail = |reason: String| CheckpointError::Adapter {
                    path: source.path.clone(),
                    reason,
                };
                let weights =
                    load_adapter(&source.path, &checkpoint).map_err(|e| fail(e.to_string()))?;
                let resident =
                    ResidentAdapter::upload(backend, &weights).map_err(|e| fail(e.to_string()))?;
                Some((resident, source.parent.clone()))
            }
        };
        let draft = match &options.draft {
            None => None,
            Some(draft_path) => Some(
                load_draft(backend, store, draft_path, &tokenizer, &model, kv_format).map_err(
                    |reason| CheckpointError::Draft {
                        path: draft_path.clone(),
                        reason,
                    },
                )?,
            ),
        };
        let format = checkpoint.format;
        let mix = crate::formats::quant_mix(&checkpoint);
        drop(checkpoint);
        smoke_forward(backend, &model, &tokenizer, kv_format).map_err(|reason| {
            let (path, reason) = fail(reason);
            CheckpointError::Smoke { path, reason }
        })?;
        let mut served = Self::from_parts(id, model, tokenizer, template, path, format)
            .with_load(load_stats, started.elapsed());
        served.quant_mix = Some(mix);
        if let Some((resident, parent)) = adapter {
            served.adapter = Some(resident);
            served.parent = Some(parent);
        }
        served.template_origin = template_origin;
        served.draft = draft;
        Ok(served)
    }

    /// This checkpoint with `draft` drafting its tokens (tests,
    /// single-model tools; `load` pairs the one its options name).
    pub fn with_draft(mut self, draft: DraftModel<B>) -> Self {
        self.draft = Some(draft);
        self
    }

    /// A checkpoint from parts already loaded (tests, single-model tools).
    pub fn from_parts(
        id: CheckpointId,
        model: LlamaModel<B>,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        source: &Path,
        format: CheckpointFormat,
    ) -> Self {
        ServedCheckpoint {
            id,
            weight_identity: model.weight_identity(),
            caches_prompts: model.caches_prompts(),
            adapter: None,
            parent: None,
            draft: None,
            model,
            tokenizer,
            template,
            template_origin: TemplateOrigin::Given,
            grammar_vocab: GrammarVocab::default(),
            source: source.to_path_buf(),
            format,
            quant_mix: None,
            load_stats: LoadStats::default(),
            load_time: Duration::ZERO,
            demand: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            last_used_ms: AtomicU64::new(now_ms()),
            placement: AtomicU8::new(0),
        }
    }

    fn with_load(mut self, stats: LoadStats, time: Duration) -> Self {
        self.load_stats = stats;
        self.load_time = time;
        self
    }

    /// Where the backend holds its matrices, as the registry (demoting
    /// it) and the executor (prefetching it, seeing its copy land) last
    /// saw it: routing and status read it without asking the backend.
    pub fn placement(&self) -> WeightTier {
        match self.placement.load(Ordering::Acquire) {
            1 => WeightTier::Uploading,
            2 => WeightTier::Host,
            _ => WeightTier::Resident,
        }
    }

    /// Records where the backend holds its matrices now.
    pub fn set_placement(&self, tier: WeightTier) {
        let code = match tier {
            WeightTier::Resident => 0,
            WeightTier::Uploading => 1,
            WeightTier::Host => 2,
        };
        self.placement.store(code, Ordering::Release);
    }

    /// Requests submitted to it that have not finished.
    pub fn demand(&self) -> usize {
        self.demand.load(Ordering::Acquire)
    }

    /// Requests waiting for a batch slot.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// How long ago a request last used it.
    pub fn idle_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.last_used_ms.load(Ordering::Acquire)))
    }

    pub(super) fn enqueued(&self) {
        self.demand.fetch_add(1, Ordering::AcqRel);
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.last_used_ms.store(now_ms(), Ordering::Release);
    }

    pub(super) fn admitted(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    pub(super) fn finished(&self) {
        self.demand.fetch_sub(1, Ordering::AcqRel);
        self.last_used_ms.store(now_ms(), Ordering::Release);
    }
}

/// Milliseconds since the first call in this process (a monotonic clock
/// that fits an atomic).
/// The draft model at `path` for `target` (whose tokenizer is
/// `tokenizer`), its tensors through `store`, after the same smoke forward
/// as a served checkpoint's.
fn load_draft<B: Backend>(
    backend: &B,
    store: &WeightStore<B>,
    path: &Path,
    tokenizer: &Tokenizer,
    target: &LlamaModel<B>,
    kv_format: KvFormat,
) -> Result<DraftModel<B>, String> {
    let checkpoint = load_checkpoint(path).map_err(|e| e.to_string())?;
    let draft_tokenizer = Tokenizer::load(&checkpoint.tokenizer)
        .map_err(|e| format!("cannot load its tokenizer: {e}"))?;
    let (model, _) = LlamaModel::load_shared(backend, &checkpoint, store)
        .map_err(|e| format!("cannot load its weights: {e}"))?;
    drop(checkpoint);
    smoke_forward(backend, &model, &draft_tokenizer, kv_format)?;
    DraftModel::pair(
        model,
        path,
        &draft_tokenizer,
        tokenizer,
        target.config().vocab_size,
    )
}

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Runs BOS (or token 0) and one more token through `model`: shapes that
/// disagree with the config, or weights that produce NaN, fail here
/// rather than on a client's request.
fn smoke_forward<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    tokenizer: &Tokenizer,
    kv_format: KvFormat,
) -> Result<(), String> {
    let first = tokenizer.bos_id().unwrap_or(0);
    let tokens = [first, first];
    // A cache of the served format, outside the serving budget.
    let pool = crate::kv::KvPool::new(crate::kv::KvConfig {
        dtype: kv_format.dtype,
        budget_bytes: usize::MAX,
        block_positions: kv_format.block_positions,
    });
    let blocks = crate::kv::KvBlocks::new(backend, &pool).map_err(|e| e.to_string())?;
    let mut cache =
        crate::kv::SequenceKv::for_model(backend, &blocks, model, tokens.len(), KvPrefix::none())
            .map_err(|e| e.to_string())?;
    let mut scratch = model.new_scratch(backend);
    let mut chunks = [SequenceChunk {
        tokens: &tokens,
        start_pos: 0,
        table: cache
            .prepare(backend, 0..tokens.len())
            .map_err(|e| e.to_string())?,
        logits: LogitRows::All,
        prompt: true,
    }];
    let logits = model
        .forward(backend, &mut blocks.lock(), &mut chunks, &mut scratch)
        .map_err(|e| e.to_string())?;
    let expected = tokens.len() * model.config().vocab_size;
    if logits.len() != expected {
        return Err(format!(
            "it returned {} logits for {} tokens of a {}-token vocabulary",
            logits.len(),
            tokens.len(),
            model.config().vocab_size
        ));
    }
    match logits.iter().enumerate().find(|(_, l)| !l.is_finite()) {
        Some((i, value)) => Err(format!(
            "logit {} of token {} is {value} (weights with NaN or infinity?)",
            i % model.config().vocab_size,
            i / model.config().vocab_size,
        )),
        None => Ok(()),
    }
}

/// A shared handle to a served checkpoint.
pub type CheckpointHandle<B> = Arc<ServedCheckpoint<B>>;
