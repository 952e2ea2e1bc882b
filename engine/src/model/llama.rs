//! The Llama-family transformer (Llama 2/3, SmolLM2, TinyLlama, Mistral,
//! Qwen2) written once against [`Backend`].
//!
//! A forward step takes chunks of one or more sequences (a prompt being
//! prefilled, or one new token of each of several sequences being decoded)
//! and runs them as one batch: every matrix multiply sees all rows at once,
//! attention runs per sequence over that sequence's KV cache.

use switchyard_kernels::{AttentionShape, Backend, MatmulProduct};

use super::weights::{LayerWeights, LoadStats, ModelWeights};
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
}

/// One sequence's share of a forward step.
pub struct SequenceChunk<'a, B: Backend> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many tokens `cache` already holds.
    pub start_pos: usize,
    pub cache: &'a mut B::KvCache,
    pub logits: LogitRows,
}

/// A Llama-family model resident in a backend.
pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    weights: ModelWeights<B>,
    inv_freq: Vec<f32>,
    attention: AttentionShape,
}

/// Activation buffers reused across steps (one set per executor).
pub struct Scratch<B: Backend> {
    x: B::Activations,
    normed: B::Activations,
    q: B::Activations,
    k: B::Activations,
    v: B::Activations,
    attn: B::Activations,
    proj: B::Activations,
    gate: B::Activations,
    up: B::Activations,
    selected: B::Activations,
    logits: B::Activations,
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
            scale: 1.0 / (config.head_dim as f32).sqrt(),
        };
        let model = Self {
            inv_freq: config.rope_inv_freq(),
            config,
            weights,
            attention,
        };
        Ok((model, stats))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A KV cache for one sequence of up to `capacity` tokens.
    pub fn new_cache(&self, backend: &B, capacity: usize) -> Result<B::KvCache, ModelError> {
        Ok(backend.kv_cache(
            self.config.n_layers,
            self.config.n_kv_heads,
            self.config.head_dim,
            capacity,
        )?)
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
        }
    }

    /// Runs one step over `chunks` and returns the requested logits, row after
    /// row in chunk order (`vocab_size` floats per row).
    pub fn forward(
        &self,
        backend: &B,
        chunks: &mut [SequenceChunk<'_, B>],
        scratch: &mut Scratch<B>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let (tokens, positions) = self.flatten(chunks)?;
        let n = tokens.len();
        let q_width = c.n_heads * c.head_dim;
        let kv_width = c.n_kv_heads * c.head_dim;

        backend.resize(&mut scratch.x, n, c.hidden_size);
        backend.embed(&self.weights.embed, &tokens, &mut scratch.x)?;
        backend.resize(&mut scratch.normed, n, c.hidden_size);
        backend.resize(&mut scratch.q, n, q_width);
        backend.resize(&mut scratch.k, n, kv_width);
        backend.resize(&mut scratch.v, n, kv_width);
        backend.resize(&mut scratch.attn, n, q_width);
        backend.resize(&mut scratch.proj, n, c.hidden_size);
        backend.resize(&mut scratch.gate, n, c.intermediate_size);
        backend.resize(&mut scratch.up, n, c.intermediate_size);

        for (index, layer) in self.weights.layers.iter().enumerate() {
            self.attention_block(backend, index, layer, chunks, &positions, scratch)?;
            self.mlp_block(backend, layer, scratch)?;
        }
        self.logits(backend, chunks, scratch)
    }

    fn flatten(&self, chunks: &[SequenceChunk<'_, B>]) -> Result<(Vec<u32>, Vec<u32>), ModelError> {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        for chunk in chunks {
            for (i, &token) in chunk.tokens.iter().enumerate() {
                if token as usize >= self.config.vocab_size {
                    return Err(ModelError::TokenOutOfRange {
                        token,
                        vocab_size: self.config.vocab_size,
                    });
                }
                let position = chunk.start_pos + i;
                if position >= self.config.context_length {
                    return Err(ModelError::ContextExceeded {
                        position,
                        context_length: self.config.context_length,
                    });
                }
                tokens.push(token);
                positions.push(position as u32);
            }
        }
        if tokens.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        Ok((tokens, positions))
    }

    fn attention_block(
        &self,
        backend: &B,
        index: usize,
        layer: &LayerWeights<B>,
        chunks: &mut [SequenceChunk<'_, B>],
        positions: &[u32],
        s: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        backend.rms_norm(&s.x, &layer.attn_norm, c.rms_norm_eps, &mut s.normed)?;
        let [bq, bk, bv] = match &layer.qkv_bias {
            Some([q, k, v]) => [Some(&***q), Some(&***k), Some(&***v)],
            None => [None, None, None],
        };
        // One call: the backend quantizes `normed` once for all three.
        backend.matmul_many(
            &s.normed,
            &mut [
                MatmulProduct {
                    w: &layer.wq,
                    bias: bq,
                    out: &mut s.q,
                },
                MatmulProduct {
                    w: &layer.wk,
                    bias: bk,
                    out: &mut s.k,
                },
                MatmulProduct {
                    w: &layer.wv,
                    bias: bv,
                    out: &mut s.v,
                },
            ],
        )?;
        backend.rope(
            &mut s.q,
            c.head_dim,
            positions,
            &self.inv_freq,
            c.rope_style,
        )?;
        backend.rope(
            &mut s.k,
            c.head_dim,
            positions,
            &self.inv_freq,
            c.rope_style,
        )?;
        let mut row = 0;
        for chunk in chunks.iter_mut() {
            let rows = row..row + chunk.tokens.len();
            row = rows.end;
            backend.attention(
                chunk.cache,
                index,
                self.attention,
                &s.q,
                &s.k,
                &s.v,
                rows,
                chunk.start_pos,
                &mut s.attn,
            )?;
        }
        backend.matmul(&s.attn, &layer.wo, None, &mut s.proj)?;
        backend.add(&mut s.x, &s.proj)?;
        Ok(())
    }

    fn mlp_block(
        &self,
        backend: &B,
        layer: &LayerWeights<B>,
        s: &mut Scratch<B>,
    ) -> Result<(), ModelError> {
        backend.rms_norm(
            &s.x,
            &layer.ffn_norm,
            self.config.rms_norm_eps,
            &mut s.normed,
        )?;
        backend.matmul_many(
            &s.normed,
            &mut [
                MatmulProduct {
                    w: &layer.gate,
                    bias: None,
                    out: &mut s.gate,
                },
                MatmulProduct {
                    w: &layer.up,
                    bias: None,
                    out: &mut s.up,
                },
            ],
        )?;
        backend.silu_mul(&mut s.gate, &s.up)?;
        backend.matmul(&s.gate, &layer.down, None, &mut s.proj)?;
        backend.add(&mut s.x, &s.proj)?;
        Ok(())
    }

    /// Final norm and output projection, on the rows that want logits only
    /// (the output projection is the largest matrix of a small model).
    fn logits(
        &self,
        backend: &B,
        chunks: &[SequenceChunk<'_, B>],
        s: &mut Scratch<B>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let mut wanted = Vec::new();
        let mut row = 0;
        for chunk in chunks {
            let len = chunk.tokens.len();
            match chunk.logits {
                LogitRows::None => {}
                LogitRows::Last => wanted.push(row + len - 1),
                LogitRows::All => wanted.extend(row..row + len),
            }
            row += len;
        }
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        backend.rms_norm(
            &s.x,
            &self.weights.output_norm,
            c.rms_norm_eps,
            &mut s.normed,
        )?;
        let mut host = vec![0.0f32; wanted.len() * c.hidden_size];
        for (dst, &src) in host.chunks_exact_mut(c.hidden_size).zip(&wanted) {
            backend.read_row(&s.normed, src, dst);
        }
        s.selected = backend.activations_from(wanted.len(), c.hidden_size, &host);
        backend.resize(&mut s.logits, wanted.len(), c.vocab_size);
        backend.matmul(&s.selected, self.weights.lm_head(), None, &mut s.logits)?;
        let mut out = vec![0.0f32; wanted.len() * c.vocab_size];
        for (i, dst) in out.chunks_exact_mut(c.vocab_size).enumerate() {
            backend.read_row(&s.logits, i, dst);
        }
        Ok(out)
    }
}
