//! Moving a checkpoint's tensors into a backend: matrices stay zero-copy
//! where the backend allows, vectors are dequantized to f32 once.

use switchyard_kernels::{cpu::dequantize_row, Backend, WeightView};

use super::ModelError;
use crate::formats::{Checkpoint, TensorData};

/// The weights of one transformer block, in the backend.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Vector,
    pub wq: B::Matrix,
    pub wk: B::Matrix,
    pub wv: B::Matrix,
    pub wo: B::Matrix,
    /// Q, K and V biases (Qwen2), all present or all absent.
    pub qkv_bias: Option<[B::Vector; 3]>,
    pub ffn_norm: B::Vector,
    pub gate: B::Matrix,
    pub up: B::Matrix,
    pub down: B::Matrix,
}

/// All weights of a Llama-family model, in the backend.
pub struct ModelWeights<B: Backend> {
    pub embed: B::Matrix,
    /// `None` when the output projection is tied to `embed`.
    pub output: Option<B::Matrix>,
    pub output_norm: B::Vector,
    pub layers: Vec<LayerWeights<B>>,
}

impl<B: Backend> ModelWeights<B> {
    /// The matrix that projects hidden states to logits.
    pub fn lm_head(&self) -> &B::Matrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }

    /// Hands every tensor the forward pass needs to `backend`. The loader has
    /// already checked names and shapes against the config; this re-checks
    /// what it relies on so a mismatch is an error, not a panic.
    pub fn load(backend: &B, checkpoint: &Checkpoint) -> Result<Self, ModelError> {
        let loader = Loader {
            backend,
            checkpoint,
        };
        let config = &checkpoint.config;
        let layers = (0..config.n_layers)
            .map(|i| loader.layer(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            embed: loader.matrix("token_embd.weight")?,
            output: if config.tied_embeddings {
                None
            } else {
                Some(loader.matrix("output.weight")?)
            },
            output_norm: loader.vector("output_norm.weight")?,
            layers,
        })
    }
}

struct Loader<'a, B: Backend> {
    backend: &'a B,
    checkpoint: &'a Checkpoint,
}

impl<B: Backend> Loader<'_, B> {
    fn layer(&self, i: usize) -> Result<LayerWeights<B>, ModelError> {
        let name = |suffix: &str| format!("blk.{i}.{suffix}");
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
            attn_norm: self.vector(&name("attn_norm.weight"))?,
            wq: self.matrix(&name("attn_q.weight"))?,
            wk: self.matrix(&name("attn_k.weight"))?,
            wv: self.matrix(&name("attn_v.weight"))?,
            wo: self.matrix(&name("attn_output.weight"))?,
            qkv_bias,
            ffn_norm: self.vector(&name("ffn_norm.weight"))?,
            gate: self.matrix(&name("ffn_gate.weight"))?,
            up: self.matrix(&name("ffn_up.weight"))?,
            down: self.matrix(&name("ffn_down.weight"))?,
        })
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

    fn matrix(&self, name: &str) -> Result<B::Matrix, ModelError> {
        let t = self.tensor(name)?;
        let &[rows, cols] = t.shape.as_slice() else {
            return Err(self.bad_shape(name, "a matrix", &t.shape));
        };
        let view = WeightView::new(t.dtype, rows, cols, t.data.clone())
            .map_err(|source| self.kernel_error(name, source))?;
        self.backend
            .matrix(view)
            .map_err(|source| self.kernel_error(name, source))
    }

    fn vector(&self, name: &str) -> Result<B::Vector, ModelError> {
        let t = self.tensor(name)?;
        let &[len] = t.shape.as_slice() else {
            return Err(self.bad_shape(name, "a vector", &t.shape));
        };
        let mut values = vec![0.0f32; len];
        dequantize_row(t.dtype, &t.data, &mut values)
            .map_err(|source| self.kernel_error(name, source))?;
        self.backend
            .vector(&values)
            .map_err(|source| self.kernel_error(name, source))
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
