//! The Llama-family forward pass over a [`switchyard_kernels::Backend`].

pub mod config;
mod error;
mod layered;
pub mod llama;
mod lora_rows;
mod part;
mod pooling;
mod runs;
mod step;
pub mod weights;

pub use error::ModelError;
pub use layered::LayeredStep;
pub use llama::{LlamaModel, LogitRows, Scratch, SequenceChunk};
pub use part::ModelPart;
pub use pooling::unit_mean;
pub use step::{forward_many, forward_step, StepOutput};
