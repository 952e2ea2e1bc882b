//! The Llama-family forward pass over a [`switchyard_kernels::Backend`].

pub mod config;
