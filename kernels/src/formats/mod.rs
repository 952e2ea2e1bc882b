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
//! | [`types`] | one file per block type: layout, dequantization, quantizer ([`BlockFormat`]) |
//! | `blocks` | what several types share, and every type's offsets for the kernels |
//! | `dequant` | [`dequantize_row`]: any row of any type to f32 |
//! | [`quantize`] | f32 to any type (offline, not on the serving path) |
//! | `read`, `encode` | reading and encoding steps several types share |

pub(crate) mod blocks;
mod dequant;
mod encode;
pub mod quantize;
mod read;
pub mod types;

pub use dequant::dequantize_row;
pub use types::BlockFormat;
