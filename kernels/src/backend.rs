//! The seam between the engine and the compute kernels.
//!
//! A model's forward pass is written once, against [`Backend`]. Weights enter
//! a backend once, at load, through [`Backend::matrix`] and
//! [`Backend::vector`] (the CPU backend keeps them zero-copy over the memory
//! map; a GPU backend uploads them). Activations never leave the backend
//! except through [`Backend::host_rows`] (for logits), so the same forward
//! pass drives device memory without change.
//!
//! The trait holds what a forward pass needs and nothing else: device
//! memory (weights, activations, KV blocks by [`BlockId`]), tensor
//! operations, and attention over a sequence's [`BlockTable`]. It knows no
//! policy: which blocks exist, which sequence holds them, what they may
//! reserve, which blocks the prompt cache shares are the engine's (its
//! `kv` module), which allocates and frees blocks here and builds the
//! tables. Tests and benches build and
//! read a backend's buffers through its own types (for the CPU,
//! `CpuActivations`), or through the trait alone
//! (`tests/backend_suite.rs`, on every compiled backend).
//!
//! Activations are row-major `rows × cols` f32 matrices: one row per token in
//! a batch step.

use std::ops::Range;

use bytes::Bytes;

use crate::kv::{BlockId, BlockTable, KvBlockShape, KvFormat};
use crate::{DType, KernelError};

/// A weight matrix as stored in a checkpoint: `rows` rows of `cols` elements,
/// each row `dtype.bytes_for(cols)` bytes, rows contiguous (ggml layout: a
/// linear layer `y = W x` has one row per output feature).
#[derive(Clone, Debug)]
pub struct WeightView {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: Bytes,
}

impl WeightView {
    /// Checks that `data` holds exactly `rows × cols` elements of `dtype`.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: Bytes) -> Result<Self, KernelError> {
        let row_bytes = dtype.bytes_for(cols).ok_or(KernelError::RaggedRow {
            dtype,
            cols,
            block: dtype.block_len(),
        })?;
        let expected = row_bytes.saturating_mul(rows);
        if data.len() != expected {
            return Err(KernelError::WrongByteLength {
                dtype,
                rows,
                cols,
                expected,
                actual: data.len(),
            });
        }
        Ok(Self {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }
}

/// How rotary position embedding pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `2i` pairs with `2i + 1` (GGUF Llama files: the converter
    /// permutes the Q and K weights into this order).
    Interleaved,
    /// Dimension `i` pairs with `i + head_dim / 2` (Hugging Face's
    /// `rotate_half`; GGUF Qwen2 files).
    Neox,
}

/// Head layout for attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    /// Grouped-query attention: query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// A row at position `p` sees positions `p + 1 - window ..= p` only
    /// (sliding-window layers of Gemma, Mistral); `None` sees all.
    pub window: Option<usize>,
    /// Scores become `cap · tanh(score / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

/// One product of [`Backend::matmul_many`]: `out = x · wᵀ (+ bias)`, or
/// with `accumulate`, `out += x · wᵀ (+ bias)` (a residual connection,
/// rounded as a product into a buffer and then an add would be).
pub struct MatmulProduct<'a, B: Backend> {
    pub w: &'a B::Matrix,
    pub bias: Option<&'a B::Vector>,
    pub out: &'a mut B::Activations,
    pub accumulate: bool,
}

/// The rows [`Backend::matmul_many`] multiplies, with the elementwise step
/// that makes them when there is one: a backend can run that step inside
/// the multiply's parallel job instead of as a job of its own.
pub enum MatmulInput<'a, B: Backend> {
    /// `x` as it is.
    Rows(&'a B::Activations),
    /// `out = rms_norm(x) · weight` as [`Backend::rms_norm`] computes it;
    /// the products take `out`.
    RmsNorm {
        x: &'a B::Activations,
        weight: &'a B::Vector,
        eps: f32,
        out: &'a mut B::Activations,
    },
    /// `gate = silu(gate) · up` as [`Backend::silu_mul`] computes it; the
    /// products take `gate`.
    SiluMul {
        gate: &'a mut B::Activations,
        up: &'a B::Activations,
    },
    /// `gate = gelu_tanh(gate) · up` as [`Backend::gelu_mul`] computes it;
    /// the products take `gate`.
    GeluMul {
        gate: &'a mut B::Activations,
        up: &'a B::Activations,
    },
}

/// One run of rows of [`Backend::lora`]: rows `rows` of `x` and `out` take
/// one adapter's low-rank update of one weight, `out += scale · (x · Aᵀ) · B`
/// (shrink to `rank` columns, then expand), as LoRA adds it beside the
/// base's product. Both are matrices of a float type the backend reads
/// widened to f32 (the CPU: F32 or BF16).
pub struct LoraRows<'a, B: Backend> {
    pub rows: Range<usize>,
    /// The shrink `A`: `rank × in` (`in` is `x`'s width).
    pub a: &'a B::Matrix,
    /// The expand, transposed: `rank × out` (`Bᵀ`, `out`'s width per
    /// row), so each row's update is `rank` scaled adds of contiguous
    /// rows.
    pub b_t: &'a B::Matrix,
    /// `alpha / rank` (times any user scale).
    pub scale: f32,
}

/// Which half of a LoRA update an adapter matrix feeds (see
/// [`Backend::lora_matrix`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LoraSide {
    /// `A`: `x · Aᵀ`, the input's width down to the rank.
    Shrink,
    /// `Bᵀ`: the rank back up to the output's width.
    Expand,
}

/// One output of [`Backend::lora_many`]: its runs and the rows they add to.
pub struct LoraUpdate<'a, 'o, B: Backend> {
    pub runs: &'a [LoraRows<'a, B>],
    pub out: &'o mut B::Activations,
}

/// One sequence of [`Backend::attention`]: its rows of `q`, `k`, `v`
/// and `out`, at positions `start_pos..start_pos + rows.len()` of the
/// blocks `table` names (every block those positions land in is in the
/// table, and written by no other sequence of the call).
pub struct AttentionRows<'a> {
    pub table: &'a BlockTable,
    pub rows: Range<usize>,
    pub start_pos: usize,
    /// Rows of a prompt (any chunk of it, however short), not of a decode
    /// or speculative-verify step: under `AttentionPrecision::Bf16Prompt`
    /// and `Bf16x3` (and `Bf16`) the CPU gives exactly these rows BF16
    /// products on AMX tiles, so a prompt row's result does not depend on
    /// its chunk.
    pub prompt: bool,
}

/// What makes a step's launches the same as another step's: the engine
/// gives equal keys to steps of one checkpoint with the same rows per
/// sequence, so that a device backend can record one step's launches (a
/// CUDA graph) and replay them for the next. A backend checks the promise
/// call by call and answers [`KernelError::StepDiverged`] where it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepKey(pub u64);

/// Where a backend holds a checkpoint's weight matrices (see
/// [`Backend::weight_tier`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightTier {
    /// Where the backend's kernels read them: a GPU's memory, or the
    /// host's RAM for a backend that computes there (the CPU's weights are
    /// always here: everything it holds is host-resident and runnable).
    Resident,
    /// Being copied up to the device beside the running steps: a step must
    /// not read them until the copy lands.
    Uploading,
    /// In (pinned) host memory only: [`Backend::prefetch`] copies them up.
    Host,
}

/// A compute backend. See the module documentation.
///
/// Every method that can meet inconsistent shapes returns an error rather
/// than panicking; the engine validates shapes at load, so those errors mean
/// an engine bug, not bad input.
pub trait Backend: Send + Sync + 'static {
    /// A weight matrix ready for [`Backend::matmul`] and [`Backend::embed`].
    type Matrix: Send + Sync + 'static;
    /// A small f32 parameter vector (norm weights, biases).
    type Vector: Send + Sync + 'static;
    /// A row-major f32 activation matrix.
    type Activations: Send + 'static;
    /// Device memory of KV blocks, each named by a [`BlockId`]: one store
    /// per KV budget, shared by every sequence of its steps.
    type KvStore: Send + 'static;

    /// Whether the weights it holds are in a device's own memory (a GPU's)
    /// rather than the host's RAM: the registry reports loaded checkpoints
    /// in the `device` tier then, and routing weighs them so.
    const DEVICE_MEMORY: bool = false;

    /// A short name for logs (`cpu-avx512vnni`, ...).
    fn name(&self) -> String;

    // --- memory -----------------------------------------------------------

    fn matrix(&self, weight: WeightView) -> Result<Self::Matrix, KernelError>;
    /// A matrix that only [`Backend::lora`] reads (an adapter's `A`, the
    /// shrink, or `Bᵀ`, the expand): a backend may skip the extra layouts
    /// its matmul kernels keep (the CPU's packed copy of Q8_0 rows) and
    /// store it in the order its LoRA kernel for `side` reads fastest, at
    /// the view's size.
    fn lora_matrix(&self, weight: WeightView, side: LoraSide) -> Result<Self::Matrix, KernelError> {
        let _ = side;
        self.matrix(weight)
    }
    fn vector(&self, values: &[f32]) -> Result<Self::Vector, KernelError>;
    /// Zero-filled activations.
    fn activations(&self, rows: usize, cols: usize) -> Self::Activations;
    /// Every row of `x` on the host, row after row: a backend whose
    /// activations live in host memory lends them as they are, a device
    /// backend copies them into `staging` (kept by the caller and reused,
    /// so a step's logits cost no allocation).
    fn host_rows<'a>(&self, x: &'a Self::Activations, staging: &'a mut Vec<f32>) -> &'a [f32];
    /// The greedy token of `row`, one row of logits on the host (see
    /// [`crate::argmax`]): the CPU backend searches it on all its threads.
    fn argmax(&self, row: &[f32]) -> u32 {
        crate::argmax::argmax(row)
    }
    /// Reshapes `x` to `rows × cols` without preserving contents (reuses the allocation).
    fn resize(&self, x: &mut Self::Activations, rows: usize, cols: usize);
    /// An empty store for blocks of `format` (a device backend may set
    /// `budget_bytes` of memory aside for it at once).
    fn kv_store(&self, format: KvFormat, budget_bytes: usize)
        -> Result<Self::KvStore, KernelError>;
    /// A new block of `shape` in `store`, zero-filled; fails when the
    /// device refuses the memory.
    fn kv_alloc(
        &self,
        store: &mut Self::KvStore,
        shape: KvBlockShape,
    ) -> Result<BlockId, KernelError>;
    /// Gives block `id`'s memory back (an id not in `store` is ignored).
    /// No `self`: the engine frees a block when its last holder drops, where
    /// it has the store but not the backend.
    fn kv_free(store: &mut Self::KvStore, id: BlockId)
    where
        Self: Sized;
    /// Copies the first `positions` (whole [`crate::kv::KV_UNIT`]s) of block
    /// `from` to the start of block `to`, of the same type and heads: the
    /// written start of a sequence's block into a prompt-cache tail, and a
    /// tail into a new sequence's first block of its own.
    fn kv_copy(
        &self,
        store: &mut Self::KvStore,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError>;

    // --- residency tiers ----------------------------------------------------
    //
    // A backend with memory of its own (a GPU) can move a checkpoint's
    // matrices out of it into host memory and back, the copy up running
    // beside the current step. The engine's registry demotes what it
    // evicts, and its executor prefetches the checkpoint the next batch
    // needs and runs a checkpoint only once it is `Resident`. The defaults
    // are the CPU backend's answers: its weights are always where its
    // kernels read them, and it has no other tier.

    /// Where `weights` are now (the slowest of them): `Host` if any is in
    /// host memory only, else `Uploading` if a copy of any is in flight.
    fn weight_tier(&self, weights: &[&Self::Matrix]) -> WeightTier {
        let _ = weights;
        WeightTier::Resident
    }
    /// Moves `weights` out of device memory into host memory, waiting for
    /// the copies. `false` (nothing moved) when the backend has no host
    /// tier or its host budget cannot take them: the caller drops them
    /// instead (to disk). The caller must not run them meanwhile.
    fn demote(&self, weights: &[&Self::Matrix]) -> Result<bool, KernelError> {
        let _ = weights;
        Ok(false)
    }
    /// Starts copying `weights` that are in host memory up to the device
    /// and returns at once (their tier then); the copies land while steps
    /// run. A device that refuses the memory fails it.
    fn prefetch(&self, weights: &[&Self::Matrix]) -> Result<WeightTier, KernelError> {
        Ok(self.weight_tier(weights))
    }
    /// Bytes of weights held in host memory only (demoted), against the
    /// host tier's budget.
    fn host_tier_bytes(&self) -> u64 {
        0
    }

    // --- steps ------------------------------------------------------------

    /// A step of `key` begins (none: a step that is not to be recorded).
    /// A backend that launches each call as it comes ignores it.
    fn begin_step(&self, key: Option<StepKey>) {
        let _ = key;
    }
    /// The step's last operation was issued; its results are read next. A
    /// replaying backend launches the recorded step here. On
    /// [`KernelError::StepDiverged`] (here or from any call of the step)
    /// nothing of the step ran: the engine runs it again without a key.
    fn end_step(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// The step failed before [`Backend::end_step`]: whatever it recorded
    /// is dropped. The engine runs a failed keyed step once more without a
    /// key (a replayed or captured step launched nothing; an eager one's
    /// writes are the same the second time).
    fn abort_step(&self) {}

    // --- operations -------------------------------------------------------

    /// `out[i] = table[tokens[i]]` (a dequantized row per token).
    fn embed(
        &self,
        table: &Self::Matrix,
        tokens: &[u32],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError>;
    /// `out = x / rms(x) * weight` per row.
    fn rms_norm(
        &self,
        x: &Self::Activations,
        weight: &Self::Vector,
        eps: f32,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError>;
    /// `out = x · Wᵀ (+ bias)`: `x` is `n × cols`, `W` is `rows × cols`, `out` is `n × rows`.
    fn matmul(
        &self,
        x: &Self::Activations,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError>;
    /// Every product of `products` (see [`MatmulProduct`]) on the rows of
    /// `input`: one or several matrices against one input (Q/K/V,
    /// gate/up), the input's elementwise step first. A backend can quantize
    /// the input once for all of them and run the step, the quantization
    /// and the products as one parallel job.
    fn matmul_many(
        &self,
        input: MatmulInput<'_, Self>,
        products: &mut [MatmulProduct<'_, Self>],
    ) -> Result<(), KernelError>
    where
        Self: Sized;
    /// Rotates each head of each row in place; row `i` is at `positions[i]`.
    /// `inv_freq` has `head_dim / 2` entries (scaling already applied).
    fn rope(
        &self,
        x: &mut Self::Activations,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        style: RopeStyle,
    ) -> Result<(), KernelError>;
    /// Causal attention for several sequences of one step, whose rows of
    /// `q`, `k`, `v` and `out` are disjoint and in ascending order (see
    /// [`AttentionRows`]). For each sequence, writes its rows' keys and
    /// values into its blocks of `layer` in `store` first, then attends
    /// over positions `0..=pos` for each row (or the layer's window),
    /// writing `out[rows]`. Fails where a table lacks a block the rows
    /// land in, or two sequences would write one block.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &Self::Activations,
        k: &Self::Activations,
        v: &Self::Activations,
        store: &mut Self::KvStore,
        seqs: &[AttentionRows<'_>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError>
    where
        Self: Sized;
    /// `gate = silu(gate) * up`, elementwise.
    fn silu_mul(
        &self,
        gate: &mut Self::Activations,
        up: &Self::Activations,
    ) -> Result<(), KernelError>;
    /// `gate = gelu(gate) * up`, elementwise, with the tanh approximation
    /// of GELU (Gemma's GeGLU).
    fn gelu_mul(
        &self,
        gate: &mut Self::Activations,
        up: &Self::Activations,
    ) -> Result<(), KernelError>;
    /// `x *= factor`, elementwise (Gemma's embedding scale).
    fn scale(&self, x: &mut Self::Activations, factor: f32) -> Result<(), KernelError>;
    /// `x = cap · tanh(x / cap)`, elementwise (Gemma 2's final logits).
    fn softcap(&self, x: &mut Self::Activations, cap: f32) -> Result<(), KernelError>;
    /// RMS-normalizes each `weight.len()`-wide head of every row in place
    /// (query and key norms of Qwen3 and Gemma 3).
    fn rms_norm_heads(
        &self,
        x: &mut Self::Activations,
        weight: &Self::Vector,
        eps: f32,
    ) -> Result<(), KernelError>;
    /// `x += y`, elementwise.
    fn add(&self, x: &mut Self::Activations, y: &Self::Activations) -> Result<(), KernelError>;
    /// Adds each run's LoRA update (see [`LoraRows`]) to its rows of
    /// `out`: the rows of a step grouped by adapter, the base's product
    /// already in `out`. Each row's update depends on that row alone, so a
    /// row gets the same bits whichever rows share its step. A backend
    /// without it refuses adapters with [`KernelError::Unsupported`].
    fn lora(
        &self,
        x: &Self::Activations,
        runs: &[LoraRows<'_, Self>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError>
    where
        Self: Sized,
    {
        let _ = (x, out);
        if runs.is_empty() {
            return Ok(());
        }
        Err(KernelError::Unsupported {
            op: "lora",
            backend: self.name(),
        })
    }
    /// [`Backend::lora`] for several outputs of the same input `x` (Q, K
    /// and V; gate and up), in one call so that a backend can run them as
    /// one job; each output gets the bits `lora` would give it.
    fn lora_many(
        &self,
        x: &Self::Activations,
        updates: &mut [LoraUpdate<'_, '_, Self>],
    ) -> Result<(), KernelError>
    where
        Self: Sized,
    {
        for update in updates.iter_mut() {
            self.lora(x, update.runs, update.out)?;
        }
        Ok(())
    }
    /// Copies rows `rows` of `src` into `dst` from row `dst_row` on (same
    /// width). A step that runs several checkpoints at once gathers the rows
    /// of the checkpoints whose tensor differs, multiplies them apart, and
    /// scatters the results back with it.
    fn copy_rows(
        &self,
        src: &Self::Activations,
        rows: Range<usize>,
        dst: &mut Self::Activations,
        dst_row: usize,
    ) -> Result<(), KernelError>;
}
