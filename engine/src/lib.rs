//! Switchyard's engine: loads checkpoints (GGUF, Hugging Face safetensors),
//! tokenizes, runs the Llama-family forward pass on a kernels backend,
//! samples and generates.

pub mod chat;
pub mod formats;
pub mod model;
pub mod prompt;
pub mod registry;
pub mod repository;
pub mod sampling;
pub mod serving;
pub mod session;
pub mod store;
pub mod synthetic;
pub mod tokenizer;
