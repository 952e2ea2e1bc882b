//! Switchyard's engine: loads checkpoints (GGUF, Hugging Face safetensors),
//! tokenizes, runs the Llama-family forward pass on a kernels backend,
//! samples and generates.
//!
//! [`Engine`] is the front door: it takes a [`switchyard_seam::GenerationRequest`]
//! and returns the stream of its events. The modules below it are the stages a
//! request passes through (`prompt`, `serving`, `model`, `sampling`) and the
//! checkpoints they run on (`registry`, `repository`, `store`, `formats`).

pub mod adapter;
pub mod chat;
pub mod chat_choice;
pub mod chat_tools;
mod engine;
pub mod eval;
pub mod formats;
pub mod kv;
pub mod model;
pub mod prompt;
pub mod registry;
pub mod repository;
pub mod sampling;
pub mod serving;
pub mod session;
pub mod speculate;
pub mod store;
pub mod structured;
pub mod synthetic;
pub mod tokenizer;

pub use engine::{prepare, Engine};
