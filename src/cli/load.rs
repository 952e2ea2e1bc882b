//! Loading a checkpoint and a backend, shared by the subcommands.

use std::path::Path;

use anyhow::Context;
use switchyard_engine::formats::{load_checkpoint, Checkpoint};
use switchyard_kernels::cpu::{CpuBackend, KvConfig, KvType};

#[derive(clap::Args)]
pub struct ThreadsArg {
    /// Worker threads for the kernels (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the KV cache stores keys and values: f16, f32 or q8_0 (int8 in
    /// groups of 32 with f16 scales, as llama.cpp's `-ctk q8_0 -ctv q8_0`)
    /// (default: f16).
    #[arg(long)]
    pub kv_type: Option<KvType>,
}

impl ThreadsArg {
    pub fn count(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }
}

pub fn load_model(path: &Path, threads: &ThreadsArg) -> anyhow::Result<(CpuBackend, Checkpoint)> {
    let checkpoint =
        load_checkpoint(path).with_context(|| format!("cannot load {}", path.display()))?;
    let kv = KvConfig {
        dtype: threads.kv_type.unwrap_or_default(),
        ..KvConfig::default()
    };
    Ok((CpuBackend::new(threads.count()).with_kv(kv), checkpoint))
}
