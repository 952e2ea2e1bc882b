//! One sequence run through a model, token after token: the simplest way
//! to drive the forward pass (the command-line generator, numerical checks).

use std::sync::Arc;

use switchyard_kernels::Backend;

use switchyard_kernels::KvPrefix;

use crate::adapter::ResidentAdapter;
use crate::kv::{KvBlocks, KvConfig, KvError, KvPool, SequenceKv};
use crate::model::{LlamaModel, LogitRows, ModelError, Scratch, SequenceChunk};

/// Prompts are run in chunks of at most this many tokens, bounding the
/// activation buffers (a chunk's activations are `chunk × ffn` floats).
pub const PREFILL_CHUNK: usize = 512;

/// Why a session's step failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A sequence and its KV cache.
pub struct Session<'m, B: Backend> {
    backend: &'m B,
    model: &'m LlamaModel<B>,
    cache: SequenceKv<B>,
    scratch: Scratch<B>,
    len: usize,
    adapter: Option<&'m ResidentAdapter<B>>,
}

impl<'m, B: Backend> Session<'m, B> {
    /// A session that can hold up to `capacity` tokens (prompt and
    /// generated), its KV of the default type and block size, without a
    /// budget.
    pub fn new(backend: &'m B, model: &'m LlamaModel<B>, capacity: usize) -> Result<Self, KvError> {
        let kv = KvPool::new(KvConfig {
            budget_bytes: usize::MAX,
            ..KvConfig::default()
        });
        Self::with_kv(backend, model, &kv, capacity)
    }

    /// As [`Session::new`], its cache reserved from `kv` (its type, block
    /// size and budget).
    pub fn with_kv(
        backend: &'m B,
        model: &'m LlamaModel<B>,
        kv: &Arc<KvPool>,
        capacity: usize,
    ) -> Result<Self, KvError> {
        let capacity = capacity.min(model.config().context_length);
        let blocks = KvBlocks::new(backend, kv)?;
        Ok(Self {
            backend,
            model,
            cache: SequenceKv::for_model(backend, &blocks, model, capacity, KvPrefix::none())?,
            scratch: model.new_scratch(backend),
            len: 0,
            adapter: None,
        })
    }

    /// This session with `adapter`'s updates over the base (for every
    /// token fed from now on).
    pub fn with_adapter(mut self, adapter: Option<&'m ResidentAdapter<B>>) -> Self {
        self.adapter = adapter;
        self
    }

    /// Tokens the sequence holds so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sequence's KV cache (to read its memory use).
    pub fn cache(&self) -> &SequenceKv<B> {
        &self.cache
    }

    /// Forgets the tokens from `len` on (a speculative draft's rejected
    /// tokens): the next [`Session::feed`] continues from `len`.
    pub fn truncate(&mut self, len: usize) -> Result<(), KvError> {
        if len < self.len {
            self.cache.truncate(len)?;
            self.len = len;
        }
        Ok(())
    }

    /// Appends `tokens` and returns their embedding: the mean of their final
    /// hidden states (after the output norm) scaled to unit length, as the
    /// executor computes it for `POST /v1/embeddings`. Run on a fresh
    /// session, it embeds `tokens` alone.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SessionError> {
        let mut sum = vec![0f64; self.model.config().hidden_size];
        for piece in tokens.chunks(PREFILL_CHUNK) {
            let blocks = Arc::clone(self.cache.blocks());
            let positions = self.len..self.len + piece.len();
            let mut batch = [SequenceChunk {
                tokens: piece,
                start_pos: self.len,
                table: self.cache.prepare(self.backend, positions)?,
                logits: LogitRows::Pooled,
                prompt: true,
            }];
            let mut parts = [crate::model::ModelPart {
                model: self.model,
                chunks: &mut batch,
                adapter: self.adapter,
            }];
            let mut store = blocks.lock();
            let out = crate::model::forward_step(
                self.backend,
                &mut store,
                &mut parts,
                &mut self.scratch,
            )?;
            for (total, &value) in sum.iter_mut().zip(out.pooled) {
                *total += f64::from(value);
            }
            self.len += piece.len();
        }
        crate::model::unit_mean(&sum, tokens.len())
            .ok_or(ModelError::DegenerateEmbedding)
            .map_err(SessionError::from)
    }

    /// Appends the prompt tokens `tokens` and returns logits: for the last
    /// token only (`LogitRows::Last`) or for each of them
    /// (`LogitRows::All`), `vocab_size` floats per row.
    pub fn feed(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<f32>, SessionError> {
        self.run(tokens, rows, true)
    }

    /// [`Session::feed`] for a decode step's token or a speculative
    /// verify step's tokens, which the BF16 attention precisions keep in
    /// f32 (`SequenceChunk::prompt`), as the server does.
    pub fn decode(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<f32>, SessionError> {
        self.run(tokens, rows, false)
    }

    /// The greedy token after a decode step of `tokens` (none when
    /// `tokens` is empty), picked where the step left the last token's
    /// logits ([`Backend::argmax`]: on every thread of a CPU backend), as
    /// the server's sampler reads them in place: the row is not copied.
    pub fn decode_greedy(&mut self, tokens: &[u32]) -> Result<Option<u32>, SessionError> {
        let backend = self.backend;
        let mut token = None;
        self.run_each(tokens, LogitRows::Last, false, |row| {
            token = Some(backend.argmax(row));
        })?;
        Ok(token)
    }

    fn run(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
        prompt: bool,
    ) -> Result<Vec<f32>, SessionError> {
        let mut logits = Vec::new();
        self.run_each(tokens, rows, prompt, |rows| logits.extend_from_slice(rows))?;
        Ok(logits)
    }

    /// Runs `tokens` in chunks and hands each chunk's logits (`rows` of
    /// them; none for a chunk that makes none) to `each`, lent from the
    /// scratch.
    fn run_each(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
        prompt: bool,
        mut each: impl FnMut(&[f32]),
    ) -> Result<(), SessionError> {
        let chunks = tokens.chunks(PREFILL_CHUNK);
        let count = chunks.len();
        for (i, piece) in chunks.enumerate() {
            let wanted = match rows {
                LogitRows::All => LogitRows::All,
                LogitRows::Last if i + 1 == count => LogitRows::Last,
                _ => LogitRows::None,
            };
            let blocks = Arc::clone(self.cache.blocks());
            let positions = self.len..self.len + piece.len();
            let mut batch = [SequenceChunk {
                tokens: piece,
                start_pos: self.len,
                table: self.cache.prepare(self.backend, positions)?,
                logits: wanted,
                prompt,
            }];
            let logits = self.model.forward_adapted(
                self.backend,
                &mut blocks.lock(),
                &mut batch,
                self.adapter,
                &mut self.scratch,
            )?;
            if !logits.is_empty() {
                each(logits);
            }
            self.len += piece.len();
        }
        Ok(())
    }
}
