//! Moving a checkpoint's tensors into a backend through the weight store:
//! a tensor another checkpoint already holds is shared, a new one is copied
//! out of the file (so the checkpoint is resident, not paged in from disk
//! mid-request) and handed to the backend; vectors are dequantized to f32.

use bytes::Bytes;
use switchyard_kernels::{formats::dequantize_row, Backend, WeightView};

use std::ops::Range;

use super::ModelError;
use crate::formats::{Checkpoint, TensorData};
use crate::model::config::Architecture;
use crate::store::{Shared, TensorKey, WeightStore};

/// The weights of one transformer block, in the backend.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: Shared<B::Vector>,
    pub wq: Shared<B::Matrix>,
    pub wk: Shared<B::Matrix>,
    pub wv: Shared<B::Matrix>,
    pub wo: Shared<B::Matrix>,
    /// Q, K and V biases (Qwen2), all present or all absent.
    pub qkv_bias: Option<[Shared<B::Vector>; 3]>,
    pub ffn_norm: Shared<B::Vector>,
    pub gate: Shared<B::Matrix>,
    pub up: Shared<B::Matrix>,
    pub down: Shared<B::Matrix>,
    /// Per-head query and key norms (Qwen3, Gemma 3).
    pub qk_norm: Option<[Shared<B::Vector>; 2]>,
    /// Norms after attention and after the MLP (Gemma).
    pub post_norms: Option<[Shared<B::Vector>; 2]>,
}

/// All weights of a Llama-family model, in the backend.
pub struct ModelWeights<B: Backend> {
    pub embed: Shared<B::Matrix>,
    /// `None` when the output projection is tied to `embed`.
    pub output: Option<Shared<B::Matrix>>,
    pub output_norm: Shared<B::Vector>,
    pub layers: Vec<LayerWeights<B>>,
}

impl<B: Backend> ModelWeights<B> {
    /// The matrix that projects hidden states to logits.
    pub fn lm_head(&self) -> &B::Matrix {
        self.output.as_deref().unwrap_or(&self.embed)
    }

    /// The address of every stored tensor (matrices and vectors), in a
    /// fixed order. The store keeps one copy of equal tensors, so two
    /// models with equal addresses have equal weights (while both live).
    pub fn tensor_addresses(&self) -> Vec<usize> {
        fn at<T>(shared: &Shared<T>) -> usize {
            std::sync::Arc::as_ptr(shared) as usize
        }
        let mut addresses: Vec<usize> = self.matrices().map(at).collect();
        addresses.push(at(&self.output_norm));
        for layer in &self.layers {
            addresses.push(at(&layer.attn_norm));
            addresses.push(at(&layer.ffn_norm));
            addresses.extend(layer.qkv_bias.iter().flatten().map(at));
            addresses.extend(layer.qk_norm.iter().flatten().map(at));
            addresses.extend(layer.post_norms.iter().flatten().map(at));
        }
        addresses
    }

    /// Every matrix, in a fixed order (the same for two models of one
    /// architecture): the embedding table, the output projection if not
    /// tied, then each layer's.
    pub fn matrices(&self) -> impl Iterator<Item = &Shared<B::Matrix>> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]);
        std::iter::once(&self.embed)
            .chain(self.output.iter())
            .chain(layers)
    }

    /// Hands every tensor the forward pass needs to `backend`. The loader has
    /// already checked names and shapes against the config; this re-checks
    /// what it relies on so a mismatch is an error, not a panic.
    pub fn load(
        backend: &B,
        checkpoint: &Checkpoint,
        store: &WeightStore<B>,
    ) -> Result<(Self, LoadStats), ModelError> {
        let loader = Loader {
            backend,
            checkpoint,
            store,
            stats: std::cell::Cell::new(LoadStats::default()),
        };
        let config = &checkpoint.config;
        let layers = (0..config.n_layers)
            .map(|i| loader.layer(i))
            .collect::<Result<Vec<_>, _>>()?;
        let weights = Self {
            embed: loader.matrix("token_embd.weight")?,
            output: if config.tied_embeddings {
                None
            } else {
                Some(loader.matrix("output.weight")?)
            },
            output_norm: loader.norm("output_norm.weight")?,
            layers,
        };
        Ok((weights, loader.stats.get()))
    }
}

/// How a load used the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Bytes of every tensor the checkpoint uses.
    pub total_bytes: u64,
    /// Bytes of tensors another loaded checkpoint already held.
    pub shared_bytes: u64,
    /// Tensors the checkpoint uses, and how many of them were shared.
    pub tensors: u64,
    pub shared_tensors: u64,
}

impl LoadStats {
    fn count(&mut self, bytes: u64, shared: bool) {
        self.total_bytes += bytes;
        self.tensors += 1;
        if shared {
            self.shared_bytes += bytes;
            self.shared_tensors += 1;
        }
    }
}

struct Loader<'a, B: Backend> {
    backend: &'a B,
    checkpoint: &'a Checkpoint,
    store: &'a WeightStore<B>,
    stats: std::cell::Cell<LoadStats>,
}

impl<B: Backend> Loader<'_, B> {
    fn layer(&self, i: usize) -> Result<LayerWeights<B>, ModelError> {
        let name = |suffix: &str| format!("blk.{i}.{suffix}");
        let traits = &self.checkpoint.config.traits;
        let qk_norm = if traits.qk_norm {
            Some([
                self.norm(&name("attn_q_norm.weight"))?,
                self.norm(&name("attn_k_norm.weight"))?,
            ])
        } else {
            None
        };
        let post_norms = if traits.post_norms {
            Some([
                self.norm(&name("post_attention_norm.weight"))?,
                self.norm(&name("post_ffw_norm.weight"))?,
            ])
        } else {
            None
        };
        let (wq, wk, wv, gate, up) = if self.checkpoint.config.architecture == Architecture::Phi3 {
            self.fused(i)?
        } else {
            (
                self.matrix(&name("attn_q.weight"))?,
                self.matrix(&name("attn_k.weight"))?,
                self.matrix(&name("attn_v.weight"))?,
                self.matrix(&name("ffn_gate.weight"))?,
                self.matrix(&name("ffn_up.weight"))?,
            )
        };
        let qkv_bias = if self.checkpoint.config.qkv_bias {
            Some([
                self.vector(&name("attn_q.bias"))?,
                self.vector(&name("attn_k.bias"))?,
                self.vector(&name("attn_v.bias"))?,
            ])
        } else {
            None
        };
        Ok(LayerWeights {
            attn_norm: self.norm(&name("attn_norm.weight"))?,
            wq,
            wk,
            wv,
            wo: self.matrix(&name("attn_output.weight"))?,
            qkv_bias,
            ffn_norm: self.norm(&name("ffn_norm.weight"))?,
            gate,
            up,
            down: self.matrix(&name("ffn_down.weight"))?,
            qk_norm,
            post_norms,
        })
    }

    /// Phi-3's fused matrices split by rows (rows are contiguous, so each
    /// part is a byte range): Q, K, V from `attn_qkv`, gate then up from
    /// `ffn_up`.
    #[allow(clippy::type_complexity)]
    fn fused(
        &self,
        i: usize,
    ) -> Result<
        (
            Shared<B::Matrix>,
            Shared<B::Matrix>,
            Shared<B::Matrix>,
            Shared<B::Matrix>,
            Shared<B::Matrix>,
        ),
        ModelError,
    > {
        let c = &self.checkpoint.config;
        let (q, kv, ffn) = (
            c.n_heads * c.head_dim,
            c.n_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        let qkv = format!("blk.{i}.attn_qkv.weight");
        let up = format!("blk.{i}.ffn_up.weight");
        Ok((
            self.matrix_rows(&qkv, 0..q)?,
            self.matrix_rows(&qkv, q..q + kv)?,
            self.matrix_rows(&qkv, q + kv..q + 2 * kv)?,
            self.matrix_rows(&up, 0..ffn)?,
            self.matrix_rows(&up, ffn..2 * ffn)?,
        ))
    }

    fn tensor(&self, name: &str) -> Result<&TensorData, ModelError> {
        self.checkpoint
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.checkpoint.source.clone(),
                tensor: name.to_string(),
            })
    }

    fn matrix(&self, name: &str) -> Result<Shared<B::Matrix>, ModelError> {
        let t = self.tensor(name)?;
        let rows = t.shape.first().copied().unwrap_or(0);
        self.matrix_rows(name, 0..rows)
    }

    /// Rows `wanted` of matrix `name`, as a matrix of their own.
    fn matrix_rows(
        &self,
        name: &str,
        wanted: Range<usize>,
    ) -> Result<Shared<B::Matrix>, ModelError> {
        let t = self.tensor(name)?;
        let &[rows, cols] = t.shape.as_slice() else {
            return Err(self.bad_shape(name, "a matrix", &t.shape));
        };
        let row_bytes = t.data.len() / rows.max(1);
        let data = t
            .data
            .get(wanted.start * row_bytes..wanted.end * row_bytes)
            .filter(|_| wanted.end <= rows)
            .ok_or_else(|| {
                self.bad_shape(
                    name,
                    "a matrix holding the rows the config implies",
                    &t.shape,
                )
            })?;
        let rows = wanted.len();
        let shape = [rows, cols];
        let key = TensorKey::of(t.dtype, &shape, data);
        let bytes = data.len() as u64;
        let (matrix, shared) = self.store.matrix(key, bytes, || {
            // Copied out of the mapping: the store owns resident bytes.
            let data = Bytes::copy_from_slice(data);
            let view = WeightView::new(t.dtype, rows, cols, data)
                .map_err(|source| self.kernel_error(name, source))?;
            self.backend
                .matrix(view)
                .map_err(|source| self.kernel_error(name, source))
        })?;
        self.count(bytes, shared);
        Ok(matrix)
    }

    /// A norm weight, with the family's offset added (see
    /// [`crate::model::config::FamilyTraits::norm_offset`]).
    fn norm(&self, name: &str) -> Result<Shared<B::Vector>, ModelError> {
        self.vector_plus(name, self.checkpoint.config.traits.norm_offset)
    }

    fn vector(&self, name: &str) -> Result<Shared<B::Vector>, ModelError> {
        self.vector_plus(name, 0.0)
    }

    /// Vector `name` with `offset` added to every value.
    fn vector_plus(&self, name: &str, offset: f32) -> Result<Shared<B::Vector>, ModelError> {
        let t = self.tensor(name)?;
        let &[len] = t.shape.as_slice() else {
            return Err(self.bad_shape(name, "a vector", &t.shape));
        };
        // The offset is part of the key: the same bytes with and without
        // it are different vectors.
        let key = TensorKey::of(t.dtype, &t.shape, &t.data).offset_by(offset);
        let bytes = (len * std::mem::size_of::<f32>()) as u64;
        let (vector, shared) = self.store.vector(key, bytes, || {
            let mut values = vec![0.0f32; len];
            dequantize_row(t.dtype, &t.data, &mut values)
                .map_err(|source| self.kernel_error(name, source))?;
            if offset != 0.0 {
                values.iter_mut().for_each(|v| *v += offset);
            }
            self.backend
                .vector(&values)
                .map_err(|source| self.kernel_error(name, source))
        })?;
        self.count(bytes, shared);
        Ok(vector)
    }

    fn count(&self, bytes: u64, shared: bool) {
        let mut stats = self.stats.get();
        stats.count(bytes, shared);
        self.stats.set(stats);
    }

    fn bad_shape(&self, name: &str, expected: &'static str, shape: &[usize]) -> ModelError {
        ModelError::BadShape {
            file: self.checkpoint.source.clone(),
            tensor: name.to_string(),
            expected,
            shape: shape.to_vec(),
        }
    }

    fn kernel_error(&self, name: &str, source: switchyard_kernels::KernelError) -> ModelError {
        ModelError::Tensor {
            file: self.checkpoint.source.clone(),
            tensor: name.to_string(),
            source,
        }
    }
}
