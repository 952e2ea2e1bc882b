//! Device discovery: opens one GPU, or says in one line why it cannot.
//!
//! Creating a CUDA context without libcuda panics inside cudarc, so the
//! driver library is looked for first; a driver without a GPU fails
//! `cuInit` with CUDA_ERROR_NO_DEVICE, which becomes [`CudaError::NoDevice`].

use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};

use super::error::driver;
use super::registry::ModuleRegistry;
use super::sources::KernelModule;
use super::CudaError;

/// One opened GPU: its context, the stream kernels run on, and its
/// kernel modules (loaded on first use).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    capability: (u32, u32),
    total_bytes: usize,
    modules: ModuleRegistry,
}

/// Opens GPU `ordinal` (`--device cuda:N`).
pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
    // SAFETY: only tries to dlopen the driver library by its names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    let count = match CudaContext::device_count() {
        Ok(n) => usize::try_from(n).unwrap_or(0),
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => 0,
        Err(e) => return Err(driver("cuDeviceGetCount")(e)),
    };
    if count == 0 {
        return Err(CudaError::NoDevice);
    }
    if ordinal >= count {
        return Err(CudaError::BadOrdinal { ordinal, count });
    }
    let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver("compute capability"))?;
    let capability = (major.max(0) as u32, minor.max(0) as u32);
    if capability.0 < 8 {
        return Err(CudaError::UnsupportedGpu {
            major: capability.0,
            minor: capability.1,
        });
    }
    let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
    let total_bytes = ctx.total_mem().map_err(driver("cuDeviceTotalMem"))?;
    let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
    let modules = ModuleRegistry::new(ctx.clone(), capability);
    Ok(CudaDevice {
        ctx,
        stream,
        name,
        capability,
        total_bytes,
        modules,
    })
}

impl CudaDevice {
    /// `cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)`.
    pub fn describe(&self) -> String {
        format!(
            "cuda:{} {} (sm_{}{}, {:.1} GiB)",
            self.ctx.ordinal(),
            self.name,
            self.capability.0,
            self.capability.1,
            self.total_bytes as f64 / (1u64 << 30) as f64
        )
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn capability(&self) -> (u32, u32) {
        self.capability
    }

    /// Kernel `name` of `module`, loading the module on first use.
    pub fn function(&self, module: KernelModule, name: &str) -> Result<CudaFunction, CudaError> {
        self.modules.function(module, name)
    }

    /// How `module`'s code was obtained (`sm_90 CUBIN`, `NVRTC compute_100`).
    pub fn module_origin(&self, module: KernelModule) -> Option<String> {
        self.modules.origin(module)
    }
}

#[cfg(test)]
mod tests {
    /// Here (no GPU, no driver) opening fails in one line; on a GPU
    /// machine it opens.
    #[test]
    fn opening_without_a_driver_is_a_clean_error() {
        // SAFETY: only tries to dlopen the driver library.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        match super::open(0) {
            Ok(device) => assert!(present && device.describe().starts_with("cuda:0 ")),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "{msg}");
                if !present {
                    assert!(msg.contains("libcuda.so was not found"), "{msg}");
                }
            }
        }
    }
}
