//! The Llama-family transformer (Llama 2/3, SmolLM2, TinyLlama, Mistral,
//! Qwen2) written once against [`Backend`].
//!
//! A forward step takes chunks of one or more sequences (a prompt being
//! prefilled, or one new token of each of several sequences being decoded)
//! and runs them as one batch: every matrix multiply sees all rows at once,
//! attention runs per sequence over that sequence's KV cache. The step
//! itself is in `step.rs`, which can also run several checkpoints at once.

use switchyard_kernels::{AttentionShape, Backend, BlockTable, KernelError, KvFormat, KvLayout};

use super::runs::Gather;
use super::weights::{LoadStats, ModelWeights};
use super::ModelError;
use crate::formats::Checkpoint;
use crate::model::config::ModelConfig;
use crate::store::WeightStore;

/// Which rows of a chunk need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prompt prefix whose continuation is not sampled yet).
    None,
    /// The chunk's last token only (prefill, decode).
    Last,
    /// Every token of the chunk (scoring, numerical checks).
    All,
    /// No logits: the sum of the chunk's final hidden states (after the
    /// output norm), for a mean-pooled embedding (`StepOutput::pooled`).
    Pooled,
}

/// One sequence's share of a forward step.
pub struct SequenceChunk<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many tokens its blocks already hold.
    pub start_pos: usize,
    /// Its blocks, every one its tokens land in allocated (the engine's
    /// `SequenceKv::prepare`).
    pub table: &'a BlockTable,
    pub logits: LogitRows,
    /// Tokens of a prompt (any chunk of it), not a decode or verify step's:
    /// `AttentionRows::prompt`, which the BF16 attention precisions read.
    pub prompt: bool,
}

/// A Llama-family model resident in a backend.
pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    weights: ModelWeights<B>,
    inv_freq: Vec<f32>,
    /// Local layers' frequencies when their RoPE base differs (Gemma 3).
    inv_freq_local: Option<Vec<f32>>,
    attention: AttentionShape,
    /// Equal for checkpoints whose steps make the same calls with the same
    /// shapes (see [`LlamaModel::shapes`]).
    shapes: u64,
}

/// Activation buffers reused across steps (one set per executor).
pub struct Scratch<B: Backend> {
    pub(super) x: B::Activations,
    pub(super) normed: B::Activations,
    pub(super) q: B::Activations,
    pub(super) k: B::Activations,
    pub(super) v: B::Activations,
    pub(super) attn: B::Activations,
    pub(super) proj: B::Activations,
    pub(super) gate: B::Activations,
    pub(super) up: B::Activations,
    pub(super) selected: B::Activations,
    pub(super) logits: B::Activations,
    /// The logits on the host, for a backend that cannot lend `logits`.
    pub(super) host_logits: Vec<f32>,
    /// The normed final hidden states of the pooled chunks' rows.
    pub(super) hidden: B::Activations,
    /// `hidden` on the host, for a backend that cannot lend it.
    pub(super) host_hidden: Vec<f32>,
    /// Each pooled chunk's sum of hidden rows, one after another.
    pub(super) pooled: Vec<f32>,
    /// Rows of one checkpoint while a step that runs several multiplies them apart.
    pub(super) gather: Gather<B>,
}

impl<B: Backend> LlamaModel<B> {
    /// Loads `checkpoint` on its own (sharing no tensors with other models).
    pub fn load(backend: &B, checkpoint: &Checkpoint) -> Result<Self, ModelError> {
        Ok(Self::load_shared(backend, checkpoint, &WeightStore::new())?.0)
    }

    /// Loads `checkpoint` through `store`, sharing every tensor another
    /// loaded checkpoint already holds.
    pub fn load_shared(
        backend: &B,
        checkpoint: &Checkpoint,
        store: &WeightStore<B>,
    ) -> Result<(Self, LoadStats), ModelError> {
        let config = checkpoint.config.clone();
        let (weights, stats) = ModelWeights::load(backend, checkpoint, store)?;
        let attention = AttentionShape {
            n_heads: config.n_heads,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            scale: config.attention_scale(),
            window: None,
            softcap: config.traits.attn_softcap,
        };
        let model = Self {
            shapes: shapes_of(checkpoint),
            inv_freq: config.rope_inv_freq(),
            inv_freq_local: config.rope_local_inv_freq(),
            config,
            weights,
            attention,
        };
        Ok((model, stats))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A fingerprint of the configuration and of every tensor's name, type
    /// and shape: two checkpoints with the same one (a model and its
    /// fine-tune, two versions) make the same calls with the same shapes,
    /// so their decode steps share a step key and, on a GPU, one captured
    /// graph whose weight table is swapped between them.
    pub fn shapes(&self) -> u64 {
        self.shapes
    }

    /// The blocks of a KV cache of `capacity` tokens in `format` (local
    /// layers may keep only their window of it).
    pub fn kv_layout(&self, format: KvFormat, capacity: usize) -> Result<KvLayout, KernelError> {
        KvLayout::new(
            format,
            self.config.n_layers,
            self.config.n_kv_heads,
            self.config.head_dim,
            capacity,
            &self.config.layer_windows(),
        )
    }

    pub fn new_scratch(&self, backend: &B) -> Scratch<B> {
        let empty = || backend.activations(0, 0);
        Scratch {
            x: empty(),
            normed: empty(),
            q: empty(),
            k: empty(),
            v: empty(),
            attn: empty(),
            proj: empty(),
            gate: empty(),
            up: empty(),
            selected: empty(),
            logits: empty(),
            host_logits: Vec::new(),
            hidden: empty(),
            host_hidden: Vec::new(),
            pooled: Vec::new(),
            gather: Gather::new(backend),
        }
    }

    /// What the KV of a token sequence depends on, as one number: the
    /// config and the identity of every stored tensor (the store keeps one
    /// copy of equal tensors, so checkpoints with equal weights share it
    /// whatever their names). Valid while the model lives: the prompt
    /// cache drops a key's blocks when no checkpoint holding it is loaded.
    pub fn weight_identity(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        format!("{:?}", self.config).hash(&mut hasher);
        self.weights.tensor_addresses().hash(&mut hasher);
        hasher.finish()
    }

    /// Whether a sequence's KV can go to the prompt cache: every model's
    /// can, a sliding-window layer's (Gemma 3's local layers) as a copy of
    /// its ring where the prompt ended (`kv::window`), since its blocks are
    /// overwritten as the window moves.
    pub fn caches_prompts(&self) -> bool {
        true
    }

    /// Whether a step can run this model's rows together with `other`'s
    /// ([`super::forward_many`]) and gain by it: the same architecture and shapes,
    /// and at least half of this model's matrix bytes the very same stored
    /// tensors (checkpoints derived from one base; frozen layers).
    pub fn shares_steps_with(&self, other: &LlamaModel<B>) -> bool {
        if self.config != other.config {
            return false;
        }
        let (mut shared, mut total) = (0u64, 0u64);
        for (mine, theirs) in self.weights.matrices().zip(other.weights.matrices()) {
            total += mine.bytes();
            if std::sync::Arc::ptr_eq(mine, theirs) {
                shared += mine.bytes();
            }
        }
        total > 0 && shared * 2 >= total
    }

    /// Every weight matrix, for the backend's residency tiers (the
    /// executor prefetches them and asks whether they are on the device).
    pub fn weight_matrices(&self) -> Vec<&B::Matrix> {
        self.weights.matrices().map(|m| &***m).collect()
    }

    /// The matrices no other loaded checkpoint shares: what the registry
    /// moves out of device memory when it demotes this one (a shared
    /// tensor stays for the checkpoints still running on it).
    pub fn unshared_matrices(&self) -> Vec<&B::Matrix> {
        self.weights
            .matrices()
            .filter(|m| std::sync::Arc::strong_count(m) == 1)
            .map(|m| &***m)
            .collect()
    }

    pub(super) fn weights(&self) -> &ModelWeights<B> {
        &self.weights
    }

    /// Layer `layer`'s rotary frequencies.
    pub(super) fn inv_freq(&self, layer: usize) -> &[f32] {
        match (&self.inv_freq_local, self.config.traits.window(layer)) {
            (Some(local), Some(_)) => local,
            _ => &self.inv_freq,
        }
    }

    /// Layer `layer`'s attention shape (its window, if local).
    pub(super) fn attention_shape(&self, layer: usize) -> AttentionShape {
        AttentionShape {
            window: self.config.traits.window(layer),
            ..self.attention
        }
    }
}

/// See [`LlamaModel::shapes`].
fn shapes_of(checkpoint: &Checkpoint) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    // The configuration has no `Hash` (it holds floats); its debug form
    // names every field and value.
    format!("{:?}", checkpoint.config).hash(&mut h);
    for (name, t) in &checkpoint.tensors {
        (name, t.dtype.ggml_id(), &t.shape).hash(&mut h);
    }
    h.finish()
}
