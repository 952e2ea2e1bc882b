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
    /// GPU `N` through the CUDA backend (`cuda`, `cuda:N`); a build without
    /// the `cuda` feature, or a machine without a driver or GPU, refuses it
    /// in one line when the backend is built.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let ordinal = match lower.as_str() {
            "cpu" => return Ok(Device::Cpu),
            "cuda" => Some(0),
            other => other
                .strip_prefix("cuda:")
                .map(str::parse::<usize>)
                .and_then(Result::ok),
        };
        ordinal.map(Device::Cuda).ok_or_else(|| {
            format!("unknown device {s:?}; known: cpu, cuda, cuda:N (N the GPU's number)")
        })
    }
}

/// A subcommand's work on whichever backend `--device` chose.
pub trait OnDevice {
    type Output;

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<Self::Output>;
}

/// Builds `device`'s backend on `threads` worker threads and runs `work`
/// on it; a backend that cannot be built is a one-line error naming what
/// is missing.
pub fn on_device<W: OnDevice>(
    device: Device,
    threads: usize,
    work: W,
) -> anyhow::Result<W::Output> {
    match device {
        Device::Cpu => work.run(Arc::new(CpuBackend::new(threads))),
        Device::Cuda(ordinal) => on_cuda(ordinal, work),
    }
}

#[cfg(feature = "cuda")]
fn on_cuda<W: OnDevice>(ordinal: usize, work: W) -> anyhow::Result<W::Output> {
    use switchyard_kernels::cuda::{CudaBackend, CudaConfig};
    let config = CudaConfig {
        ordinal,
        ..CudaConfig::default()
    };
    let backend =
        CudaBackend::open(config).map_err(|e| anyhow::anyhow!("--device cuda:{ordinal}: {e}"))?;
    tracing::info!("running on {}", backend.device().describe());
    work.run(Arc::new(backend))
}

#[cfg(not(feature = "cuda"))]
fn on_cuda<W: OnDevice>(ordinal: usize, _work: W) -> anyhow::Result<W::Output> {
    match switchyard_kernels::cuda::open(ordinal) {
        Err(e) => Err(anyhow::anyhow!("--device cuda:{ordinal}: {e}")),
        Ok(device) => match device {},
    }
}

/// The device flags of the subcommands that run one model.
#[derive(clap::Args)]
pub struct DeviceArgs {
    /// Where the kernels run: cpu, or cuda[:N] (GPU N; a build with
    /// `--features cuda`).
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
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        let err = "tpu".parse::<Device>().unwrap_err();
        assert_eq!(
            err,
            "unknown device \"tpu\"; known: cpu, cuda, cuda:N (N the GPU's number)"
        );
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("cuda:".parse::<Device>().is_err());
    }

    struct Name;

    impl OnDevice for Name {
        type Output = String;

        fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<String> {
            Ok(backend.name())
        }
    }

    /// Without a GPU (or without the feature) `--device cuda` is one line
    /// naming what is missing; with one, the backend runs the work.
    #[test]
    fn cuda_without_a_gpu_is_a_one_line_error() {
        match on_device(Device::Cuda(0), 1, Name) {
            Ok(name) => assert!(name.starts_with("cuda-sm_"), "{name}"),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.starts_with("--device cuda:0: "), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
                let named = ["--features cuda", "libcuda.so", "no CUDA device"];
                assert!(named.iter().any(|n| msg.contains(n)), "{msg}");
            }
        }
        assert!(on_device(Device::Cpu, 1, Name).unwrap().starts_with("cpu"));
    }
}
