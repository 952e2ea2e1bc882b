//! What can go wrong on the CUDA side, each with a message that says what
//! to do. The first four are what `--device cuda` meets on a machine
//! without a usable GPU: one line each, never a panic.

use crate::DType;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not compiled in: rebuild with `cargo build --release --features cuda`, or use --device cpu")]
    NotCompiled,
    #[error(
        "no CUDA driver: libcuda.so was not found (install the NVIDIA driver), or use --device cpu"
    )]
    NoDriver,
    #[error("no CUDA device: the driver reports no GPU, or use --device cpu")]
    NoDevice,
    #[error("no CUDA device {ordinal}: the driver reports {count} (cuda:0 to cuda:{last})", last = count.saturating_sub(1))]
    BadOrdinal { ordinal: usize, count: usize },
    #[error("the GPU has compute capability {major}.{minor}; the CUDA backend needs 8.0 (Ampere) or newer")]
    UnsupportedGpu { major: u32, minor: u32 },
    #[error("no CUDA kernels for {target}: none embedded and NVRTC (libnvrtc.so.13) was not found; build with the toolchain of scripts/install-cuda-toolchain.sh installed")]
    NoKernels { target: String },
    #[error("NVRTC could not compile {module}.cu: {log}")]
    Nvrtc { module: &'static str, log: String },
    #[error("CUDA driver call failed in {op}: {detail}")]
    Driver { op: &'static str, detail: String },
    #[error(
        "{what} of {bytes} bytes does not fit the device budget: {free} of {budget} bytes free"
    )]
    Budget {
        what: String,
        bytes: usize,
        free: usize,
        budget: usize,
    },
    #[error("out of device memory: {bytes} bytes requested, {free} free")]
    OutOfMemory { bytes: usize, free: usize },
    #[error("access of {len} bytes at offset {offset} is outside a buffer of {size}")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("no kernel for {dtype} in {op}")]
    NoKernelFor { op: &'static str, dtype: DType },
    #[error("{0}")]
    Layout(String),
}

/// Maps a failed driver call `op` to [`CudaError::Driver`].
#[cfg(feature = "cuda")]
pub(crate) fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        op,
        detail: format!("{e:?}"),
    }
}
