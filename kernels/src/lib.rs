//! Compute kernels for Switchyard.
//!
//! This crate knows tensors, tensor types and arithmetic; it knows nothing of
//! models. The engine reaches it through the [`Backend`] trait: a model's
//! forward pass is written once against that trait, and each backend (the CPU
//! now, CUDA through cudarc next) provides weight matrices, activation
//! buffers, a KV cache and the operations between them.
//!
//! ```
//! use switchyard_kernels::{Backend, DType, WeightView, cpu::{CpuActivations, CpuBackend}};
//!
//! let backend = CpuBackend::new(1);
//! // A 2×32 F32 matrix: row 0 is all ones, row 1 all twos.
//! let mut raw = Vec::new();
//! for v in std::iter::repeat(1.0f32).take(32).chain(std::iter::repeat(2.0f32).take(32)) {
//!     raw.extend_from_slice(&v.to_le_bytes());
//! }
//! let w = backend.matrix(WeightView::new(DType::F32, 2, 32, bytes::Bytes::from(raw)).unwrap()).unwrap();
//! let x = CpuActivations::from_values(1, 32, &[1.0; 32]).unwrap();
//! let mut y = backend.activations(1, 2);
//! backend.matmul(&x, &w, None, &mut y).unwrap();
//! assert_eq!(y.row(0), Some(&[32.0, 64.0][..]));
//! ```

pub mod argmax;
pub mod attention_precision;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod formats;
pub mod kv;

pub use attention_precision::AttentionPrecision;
pub use backend::{
    AttentionRows, AttentionShape, Backend, LoraRows, LoraSide, LoraUpdate, MatmulInput,
    MatmulProduct, RopeStyle, StepKey, WeightTier, WeightView,
};
pub use dtype::DType;
pub use error::KernelError;
pub use kv::{BlockId, BlockTable, KvBlockShape, KvFormat, KvLayout, KvPrefix, KvType};
