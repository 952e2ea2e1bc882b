//! Kernel modules, loaded on first use (as candle's device does): the
//! embedded image that fits the GPU ([`super::target::choose`]), else the
//! module's source compiled by NVRTC for the GPU's own architecture.
//!
//! Lock order: `loaded` is the only lock; a module is compiled or loaded
//! while holding it for writing, so two threads never load one twice.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::error::driver;
use super::sources::{flattened, KernelModule};
use super::target::{choose, Choice, Target};
use super::CudaError;

include!(concat!(env!("OUT_DIR"), "/cuda_images.rs"));

pub(crate) struct ModuleRegistry {
    ctx: Arc<CudaContext>,
    capability: (u32, u32),
    loaded: RwLock<HashMap<KernelModule, (Arc<CudaModule>, String)>>,
}

/// The embedded targets of `module`, with their bytes.
pub(crate) fn embedded(module: KernelModule) -> Vec<(Target, &'static [u8])> {
    IMAGES
        .iter()
        .filter(|(m, _, _)| *m == module.name())
        .filter_map(|(_, t, bytes)| Some((Target::parse(t)?, *bytes)))
        .collect()
}

/// NVRTC's `--gpu-architecture` for a GPU (a `&'static str`, as cudarc
/// wants): its own where NVRTC 13 knows it, else the newest it does.
fn nvrtc_arch(capability: (u32, u32)) -> &'static str {
    match capability {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        (8, _) => "compute_80",
        _ => "compute_90",
    }
}

impl ModuleRegistry {
    pub(crate) fn new(ctx: Arc<CudaContext>, capability: (u32, u32)) -> Self {
        ModuleRegistry {
            ctx,
            capability,
            loaded: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn function(
        &self,
        module: KernelModule,
        name: &str,
    ) -> Result<CudaFunction, CudaError> {
        let m = self.module(module)?;
        m.load_function(name).map_err(driver("cuModuleGetFunction"))
    }

    pub(crate) fn origin(&self, module: KernelModule) -> Option<String> {
        let loaded = self.loaded.read().ok()?;
        loaded.get(&module).map(|(_, origin)| origin.clone())
    }

    fn module(&self, module: KernelModule) -> Result<Arc<CudaModule>, CudaError> {
        if let Some((m, _)) = self.loaded.read().map_err(|_| poisoned())?.get(&module) {
            return Ok(m.clone());
        }
        let mut loaded = self.loaded.write().map_err(|_| poisoned())?;
        if let Some((m, _)) = loaded.get(&module) {
            return Ok(m.clone());
        }
        let (ptx, origin) = self.image(module)?;
        let m = self
            .ctx
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        tracing::debug!(module = module.name(), %origin, "CUDA module loaded");
        loaded.insert(module, (m.clone(), origin));
        Ok(m)
    }

    fn image(&self, module: KernelModule) -> Result<(Ptx, String), CudaError> {
        let images = embedded(module);
        let targets: Vec<Target> = images.iter().map(|(t, _)| *t).collect();
        let (major, minor) = self.capability;
        match choose(&targets, major, minor) {
            Choice::Embedded(t) => {
                let bytes = images
                    .iter()
                    .find(|(it, _)| *it == t)
                    .map(|(_, b)| *b)
                    .unwrap_or_default();
                Ok(match t {
                    Target::Sm(ma, mi) => (
                        Ptx::from_binary(bytes.to_vec()),
                        format!("sm_{ma}{mi} CUBIN"),
                    ),
                    Target::Compute(ma, mi) => (
                        Ptx::from_src(String::from_utf8_lossy(bytes).into_owned()),
                        format!("compute_{ma}{mi} PTX"),
                    ),
                })
            }
            Choice::Nvrtc => {
                let arch = nvrtc_arch(self.capability);
                Ok((nvrtc_compile(module, arch)?, format!("NVRTC {arch}")))
            }
        }
    }
}

/// `module` compiled by NVRTC for `arch` (the run-time fallback).
pub(crate) fn nvrtc_compile(module: KernelModule, arch: &'static str) -> Result<Ptx, CudaError> {
    // SAFETY: only tries to dlopen libnvrtc by its names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::NoKernels {
            target: arch.into(),
        });
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        name: Some(format!("{}.cu", module.name())),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(flattened(module)?, opts).map_err(|e| CudaError::Nvrtc {
        module: module.name(),
        log: format!("{e:?}"),
    })
}

fn poisoned() -> CudaError {
    CudaError::Driver {
        op: "module registry",
        detail: "a thread panicked while loading a module".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback path, run where libnvrtc is (scripts/test.sh puts the
    /// toolkit's on LD_LIBRARY_PATH and sets SWITCHYARD_REQUIRE_NVRTC=1,
    /// so that a missing library fails instead of passing quietly).
    #[test]
    fn nvrtc_compiles_every_module() {
        // SAFETY: only tries to dlopen libnvrtc.
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        if !present {
            assert!(
                std::env::var_os("SWITCHYARD_REQUIRE_NVRTC").is_none(),
                "SWITCHYARD_REQUIRE_NVRTC is set but libnvrtc.so.13 is not on LD_LIBRARY_PATH"
            );
            eprintln!("libnvrtc not found: NVRTC compile not checked");
            return;
        }
        for module in KernelModule::ALL {
            let ptx = nvrtc_compile(module, "compute_80").unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.to_src().contains(".entry"), "{}", module.name());
        }
    }

    #[test]
    fn embedded_images_cover_every_module_or_none() {
        let counts: Vec<usize> = KernelModule::ALL
            .iter()
            .map(|m| embedded(*m).len())
            .collect();
        assert!(
            counts.iter().all(|c| *c == 4) || counts.iter().all(|c| *c == 0),
            "{counts:?}"
        );
    }
}
