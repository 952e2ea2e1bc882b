//! The CPU backend: SIMD kernels chosen at run time, a scalar twin for each.
//!
//! [`CpuBackend`] implements [`crate::Backend`]. Construction picks an
//! [`Isa`] once (AVX-512 with or without VNNI, AVX2, or scalar;
//! `SWITCHYARD_ISA` caps it) and starts a [`ThreadPool`]. Quantized matmuls
//! quantize activations per 32 elements (see `quant_act` for the exact
//! numeric contract) and take integer dot products against the weight
//! blocks; float weights multiply f32 activations directly. On AVX-512
//! VNNI, Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q8_0 matrices are also repacked at load into 16-row
//! groups (see `packed`) for prompt processing and batched decode; where
//! the CPU has AMX-INT8, a prompt chunk of 64 rows or more takes those
//! groups in whole tiles of 16 rows on AMX tiles (`packed::amx`, the same
//! bits; `SWITCHYARD_AMX=0` turns it off).
//! `SWITCHYARD_ISA` also accepts `neon` on aarch64 (per-row Q8_0/Q4_0/Q4_1
//! dot products).

mod activation;
#[cfg(target_arch = "x86_64")]
mod amx;
mod argmax;
mod attention;
mod backend_ops;
mod cpu_backend;
mod disjoint;
mod dot;
mod elementwise;
mod exp;
mod isa;
mod knob;
#[cfg(test)]
mod kv_cache;
mod kv_elem;
mod kv_layout;
mod kv_q8;
#[cfg(test)]
mod kv_ring_tests;
mod kv_store;
mod lora;
mod lora_elems;
mod lora_expand;
mod lora_q8;
mod lora_q8_operands;
#[cfg(target_arch = "x86_64")]
mod lora_q8_vnni;
mod lora_shrink;
mod matmul;
mod matmul_input;
mod norm;
mod packed;
mod prefetch;
mod quant_act;
mod rope;
mod row_copy;
mod tensors;
pub mod threads;
mod threads_trace;
mod vecmath;
mod weight_arena;

pub use cpu_backend::CpuBackend;
pub use isa::{Isa, ISA_ENV_VAR};
pub use kv_store::CpuKvStore;
pub use tensors::{CpuActivations, CpuMatrix, CpuVector};
pub use threads::ThreadPool;
