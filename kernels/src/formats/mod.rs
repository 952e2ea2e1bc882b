//! The GGUF block formats, device-neutral: each type's byte layout,
//! its scalar dequantization and its quantizer, one home for every
//! backend.
//!
//! A backend's kernels read blocks through these layouts (the CPU's dot
//! products use the accessors of `blocks*`); tests and tools take
//! [`dequantize_row`] as the oracle every backend's matmul is compared
//! against, and [`quantize::quantize`] to make checkpoints.
//!
//! | module | what |
//! |--------|------|
//! | `blocks` | Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q6_K: offsets and scalar accessors |
//! | `blocks_k` | Q2_K, Q3_K, Q5_K |
//! | `blocks_iq4` | IQ4_NL, IQ4_XS and their value table |
//! | `dequant`, `dequant_low_bit` | every type to f32, block by block |
//! | [`quantize`] | f32 to every type (offline, not on the serving path) |

pub(crate) mod blocks;
pub(crate) mod blocks_iq4;
pub(crate) mod blocks_k;
mod dequant;
mod dequant_low_bit;
pub mod quantize;

pub use dequant::dequantize_row;
