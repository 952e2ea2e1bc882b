//! The subcommands' device flags and the loading they share. The backend
//! itself is chosen and named in the kernels (`switchyard_kernels::device`);
//! [`on_device`] runs a subcommand's work, generic over [`Backend`]
//! ([`OnDevice`]), on the backend `--device` names, so `serve` and
//! `generate` run one code path whatever the device.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use switchyard_engine::formats::{load_checkpoint, Checkpoint};
use switchyard_engine::kv::KvConfig;
pub use switchyard_kernels::device::Device;
use switchyard_kernels::{AttentionPrecision, Backend, KvType};

/// A subcommand's work on whichever backend `--device` chose.
pub trait OnDevice {
    type Output;

    fn run<B: Backend>(self, backend: Arc<B>) -> anyhow::Result<Self::Output>;
}

/// The kernels' view of a subcommand's work: its output is the work's
/// `Result`, which [`on_device`] hands back unwrapped.
struct Fallible<W>(W);

impl<W: OnDevice> switchyard_kernels::device::OnDevice for Fallible<W> {
    type Output = anyhow::Result<W::Output>;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output {
        self.0.run(backend)
    }
}

/// Builds `device`'s backend on `threads` worker threads, attention's
/// products in `attention`, and runs `work` on it; a backend that cannot
/// be built is a one-line error naming what is missing.
pub fn on_device<W: OnDevice>(
    device: Device,
    threads: usize,
    attention: AttentionPrecision,
    work: W,
) -> anyhow::Result<W::Output> {
    if device != Device::Cpu && attention != AttentionPrecision::F32 {
        anyhow::bail!(
            "--attention-precision {attention} is a CPU option; --device {device} computes \
             attention its own way (leave the flag out or use --device cpu)"
        );
    }
    switchyard_kernels::device::on_device_with(device, threads, attention, Fallible(work))?
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
    /// Attention's products (queries·keys, probabilities·values): f32;
    /// bf16 (inputs rounded to BF16, f32 accumulation; AVX-512 BF16's
    /// `vdpbf16ps`, and AMX tiles for prompt rows, where the CPU has
    /// them); bf16-prompt (BF16 on AMX tiles for every prompt row, in
    /// any chunk, f32 for decode and verify rows and on CPUs without AMX);
    /// or bf16x3 (bf16-prompt's rows with each operand split in two BF16
    /// parts, three products summed: close to f32's results at AMX speed)
    /// [default: f32: BF16 moves every prompt's logits (greedy output can
    /// change at near-ties) and AMX hosts would answer otherwise than the
    /// rest; bf16-prompt keeps decode's f32 speed and the prompt cache's
    /// exactness and speeds prompts at 1k-32k tokens of context on an AMX
    /// host; docs/ATTENTION_PRECISION.md].
    #[arg(long)]
    pub attention_precision: Option<AttentionPrecision>,
}

impl DeviceArgs {
    /// `--attention-precision`, or the default.
    pub fn attention(&self) -> AttentionPrecision {
        self.attention_precision.unwrap_or_default()
    }

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
        match on_device(Device::Cuda(0), 1, AttentionPrecision::F32, Name) {
            Ok(name) => assert!(name.starts_with("cuda-sm_"), "{name}"),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.starts_with("--device cuda:0: "), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
                let named = ["--features cuda", "libcuda.so", "no CUDA device"];
                assert!(named.iter().any(|n| msg.contains(n)), "{msg}");
            }
        }
        assert!(on_device(Device::Cpu, 1, AttentionPrecision::F32, Name)
            .unwrap()
            .starts_with("cpu"));
        let bf16 = on_device(Device::Cpu, 1, AttentionPrecision::Bf16, Name).unwrap();
        assert!(bf16.starts_with("cpu"), "{bf16}");
        let err = on_device(Device::Cuda(0), 1, AttentionPrecision::Bf16, Name).unwrap_err();
        assert!(
            format!("{err}").contains("--attention-precision bf16 is a CPU option"),
            "{err}"
        );
    }
}
