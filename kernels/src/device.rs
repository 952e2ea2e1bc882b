//! The one place a backend is chosen and named. Everything above the
//! kernels (the engine, the binary, their tests and benches) is generic over
//! [`Backend`] and reaches a concrete backend only through here:
//! [`on_device`] builds the backend a [`Device`] names and hands it to a
//! piece of work generic over [`Backend`] ([`OnDevice`]); tests written once
//! against [`Backend`] run on every compiled backend through
//! [`on_each_device!`](crate::on_each_device). A new backend is one more
//! [`Device`] variant, one more arm in [`on_device`], and one more arm in
//! the macro.

use std::sync::Arc;

use crate::cpu::CpuBackend;
use crate::cuda::CudaError;
use crate::Backend;

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

/// A device whose backend cannot be built, in one line naming what is
/// missing. The reason is part of the message, not a `source`, so that a
/// chain printer (`{:#}`) does not repeat it.
#[derive(Debug, thiserror::Error)]
#[error("--device {device}: {reason}")]
pub struct DeviceError {
    pub device: Device,
    pub reason: CudaError,
}

/// Work to run on whichever backend a [`Device`] names: generic over the
/// backend, so it is written once for every device.
pub trait OnDevice {
    type Output;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output;
}

/// Builds `device`'s backend on `threads` worker threads (the CPU's; a
/// GPU backend ignores it) and runs `work` on it.
pub fn on_device<W: OnDevice>(
    device: Device,
    threads: usize,
    work: W,
) -> Result<W::Output, DeviceError> {
    match device {
        Device::Cpu => Ok(work.run(Arc::new(CpuBackend::new(threads)))),
        Device::Cuda(ordinal) => {
            on_cuda(ordinal, work).map_err(|reason| DeviceError { device, reason })
        }
    }
}

#[cfg(feature = "cuda")]
fn on_cuda<W: OnDevice>(ordinal: usize, work: W) -> Result<W::Output, CudaError> {
    use crate::cuda::{CudaBackend, CudaConfig};
    let config = CudaConfig {
        ordinal,
        ..CudaConfig::default()
    };
    let backend = CudaBackend::open(config)?;
    tracing::info!("running on {}", backend.device().describe());
    Ok(work.run(Arc::new(backend)))
}

#[cfg(not(feature = "cuda"))]
fn on_cuda<W: OnDevice>(ordinal: usize, _work: W) -> Result<W::Output, CudaError> {
    match crate::cuda::open(ordinal)? {}
}

/// `on_each_device!(body)` makes a module `body` with one `#[test]` per
/// compiled backend, each calling `body(backend)` with a new
/// `Arc<backend>` on 2 worker threads (`on_each_device!(body, threads = N)`
/// for another count), so a test written once against [`Backend`] runs on
/// every device. Like candle's `test_device!`; the kernels' own tests have
/// their twin `test_device!` (`kernels/tests/devices/`), which also walks
/// the CPU's instruction sets.
///
/// Built with the kernels' `cuda` feature, the module also holds a `cuda`
/// test on GPU 0 ([`on_test_gpu`]). The CUDA backend stores keys and
/// values as F16 only and attends heads of 64, 128 or 256: a body that
/// needs another KV type or head size says so,
/// `on_each_device!(body, cpu_only = "Q8_0 KV")`, and gets no CUDA test
/// (the reason stays in the source; nothing is counted as skipped).
#[macro_export]
macro_rules! on_each_device {
    ($body:ident) => {
        $crate::on_each_device!($body, threads = 2);
    };
    ($body:ident, cpu_only = $why:literal) => {
        $crate::on_each_device!(@cpu $body, 2, {});
    };
    ($body:ident, threads = $threads:expr, cpu_only = $why:literal) => {
        $crate::on_each_device!(@cpu $body, $threads, {});
    };
    ($body:ident, threads = $threads:expr) => {
        $crate::on_each_device!(@cpu $body, $threads, { $crate::__cuda_arm!($body); });
    };
    (@cpu $body:ident, $threads:expr, { $($cuda:tt)* }) => {
        mod $body {
            #[test]
            fn cpu() {
                let backend = $crate::cpu::CpuBackend::new($threads);
                super::$body(::std::sync::Arc::new(backend));
            }
            $($cuda)*
        }
    };
}

/// The `cuda` test of [`on_each_device!`]: defined by the kernels' own
/// `cuda` feature (a `cfg` inside the exported macro would test the
/// calling crate's features instead).
#[cfg(feature = "cuda")]
#[doc(hidden)]
#[macro_export]
macro_rules! __cuda_arm {
    ($body:ident) => {
        #[test]
        fn cuda() {
            struct Body;
            impl $crate::device::OnDevice for Body {
                type Output = ();
                fn run<B: $crate::Backend>(self, backend: ::std::sync::Arc<B>) {
                    super::$body(backend)
                }
            }
            $crate::device::on_test_gpu(Body);
        }
    };
}

#[cfg(not(feature = "cuda"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __cuda_arm {
    ($body:ident) => {};
}

/// Set to 1 where a GPU must be found (`scripts/gpu-check.sh`): then a
/// `cuda` test without one fails instead of skipping.
pub const REQUIRE_GPU_ENV: &str = "SWITCHYARD_REQUIRE_GPU";

/// Runs `work` on GPU 0 for an [`on_each_device!`] test. Without a GPU
/// (or a driver) the test is skipped, saying so on the terminal past the
/// harness's capture, unless [`REQUIRE_GPU_ENV`] is set, where it fails:
/// a skipped GPU test is never counted as a GPU test that passed.
pub fn on_test_gpu<W: OnDevice>(work: W) -> W::Output
where
    W::Output: Default,
{
    run_or_skip(work, std::env::var_os(REQUIRE_GPU_ENV).is_some())
}

fn run_or_skip<W: OnDevice>(work: W, required: bool) -> W::Output
where
    W::Output: Default,
{
    match on_device(Device::Cuda(0), 1, work) {
        Ok(out) => out,
        Err(e) => {
            assert!(
                !required,
                "{REQUIRE_GPU_ENV} is set but the GPU test cannot run: {e}"
            );
            // Past the test harness's capture (it takes print! and
            // eprint! only), so the skip shows in every run.
            use std::io::Write;
            let test = std::thread::current()
                .name()
                .unwrap_or("a GPU test")
                .to_owned();
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {e}");
            W::Output::default()
        }
    }
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
        let err = "tpu".parse::<Device>().err().unwrap_or_default();
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

        fn run<B: Backend>(self, backend: Arc<B>) -> String {
            backend.name()
        }
    }

    /// Without a GPU (or without the feature) `--device cuda` is one line
    /// naming what is missing; with one, the backend runs the work.
    #[test]
    fn cuda_without_a_gpu_is_a_one_line_error() {
        match on_device(Device::Cuda(0), 1, Name) {
            Ok(name) => assert!(name.starts_with("cuda-sm_"), "{name}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("--device cuda:0: "), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
                let named = ["--features cuda", "libcuda.so", "no CUDA device"];
                assert!(named.iter().any(|n| msg.contains(n)), "{msg}");
            }
        }
        let cpu = on_device(Device::Cpu, 1, Name).map_err(|e| e.to_string());
        assert!(
            cpu.as_deref().is_ok_and(|n| n.starts_with("cpu")),
            "{cpu:?}"
        );
    }

    /// A GPU test without a GPU is skipped, or fails where a GPU is
    /// required; with one it runs.
    #[test]
    fn a_gpu_test_runs_skips_or_fails_as_the_machine_and_the_setting_say() {
        let gpu = on_device(Device::Cuda(0), 1, Name).is_ok();
        let required = std::panic::catch_unwind(|| run_or_skip(Name, true));
        assert_eq!(required.is_ok(), gpu);
        let optional = run_or_skip(Name, false);
        assert_eq!(optional.starts_with("cuda-sm_"), gpu, "{optional}");
    }

    fn the_body_gets_a_backend<B: Backend>(backend: Arc<B>) {
        let name = backend.name();
        assert!(
            name.starts_with("cpu") || name.starts_with("cuda"),
            "{name}"
        );
    }

    on_each_device!(the_body_gets_a_backend, threads = 1);
}
