//! The one place a backend is chosen and named. `--device` picks it;
//! [`on_device`] builds it and hands it to a subcommand's work, which is
//! generic over [`Backend`] ([`OnDevice`]), so `serve` and `generate` run
//! one code path whatever the device. A new backend is one more [`Device`]
//! variant and one more arm in [`on_device`].

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use switchyard_engine::formats::{load_checkpoint, Checkpoint};
use switchyard_engine::kv::KvConfig;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_kernels::{Backend, KvType};

/// A device the kernels can run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The host's cores (SIMD kernels chosen at run time).
    #[default]
    Cpu,
}

impl Device {
    /// Every device this build can run on.
    pub const ALL: [Device; 1] = [Device::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Device::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let known: Vec<&str> = Device::ALL.iter().map(|d| d.name()).collect();
                format!(
                    "unknown device {s:?}; this build runs on: {}",
                    known.join(", ")
                )
            })
    }
}

/// A subcommand's work on whichever backend `--device` chose.
pub trait OnDevice {
    type Output;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output;
}

/// Builds `device`'s backend on `threads` worker threads and runs `work`
/// on it.
pub fn on_device<W: OnDevice>(device: Device, threads: usize, work: W) -> W::Output {
    match device {
        Device::Cpu => work.run(Arc::new(CpuBackend::new(threads))),
    }
}

/// The device flags of the subcommands that run one model.
#[derive(clap::Args)]
pub struct DeviceArgs {
    /// Where the kernels run: cpu (the only device of this build).
    #[arg(long, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Worker threads for the kernels (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the KV cache stores keys and values: f16, f32 or q8_0 (int8 in
    /// groups of 32 with f16 scales, as llama.cpp's `-ctk q8_0 -ctv q8_0`)
    /// (default: f16).
    #[arg(long)]
    pub kv_type: Option<KvType>,
}

impl DeviceArgs {
    pub fn count(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }

    /// The KV settings of one sequence: the type asked for, no budget.
    pub fn kv(&self) -> KvConfig {
        KvConfig {
            dtype: self.kv_type.unwrap_or_default(),
            budget_bytes: usize::MAX,
            ..KvConfig::default()
        }
    }
}

/// Reads the checkpoint at `path`.
pub fn load_model(path: &Path) -> anyhow::Result<Checkpoint> {
    load_checkpoint(path).with_context(|| format!("cannot load {}", path.display()))
}

/// The adapter at `path` (if given) checked against `base` and resident in
/// `backend`.
pub fn load_adapter<B: switchyard_kernels::Backend>(
    backend: &B,
    path: Option<&Path>,
    base: &Checkpoint,
) -> anyhow::Result<Option<switchyard_engine::adapter::ResidentAdapter<B>>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let weights = switchyard_engine::adapter::load_adapter(path, base)?;
    let resident = switchyard_engine::adapter::ResidentAdapter::upload(backend, &weights)
        .with_context(|| format!("cannot place adapter {} on the device", path.display()))?;
    Ok(Some(resident))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_by_name_and_an_unknown_one_is_named() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("CPU".parse::<Device>(), Ok(Device::Cpu));
        let err = "tpu".parse::<Device>().unwrap_err();
        assert_eq!(err, "unknown device \"tpu\"; this build runs on: cpu");
    }
}
