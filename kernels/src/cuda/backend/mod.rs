//! [`CudaBackend`]: the [`Backend`](crate::Backend) trait on one GPU.
//!
//! Weights are uploaded as they lie in the checkpoint (GGUF blocks) and
//! named to the kernels by a slot of the backend's [`WeightTable`]; a
//! decode step's products run the MMVQ kernels over activations quantized
//! to q8_1 (or the float kernels for F32/F16/BF16 weights), a prefill's
//! decode the weights to F16 and multiply with cuBLAS. Keys and values
//! live in the engine's blocks, each a run of 32-position device units
//! ([`super::kv_units`]), attended through the engine's block tables.
//! Everything runs in order on the device's one stream (cudarc's
//! per-buffer events are off: a capture must not wait on them); only
//! [`Backend::host_rows`](crate::Backend::host_rows) waits for it.
//!
//! A step the engine opens with a key is captured as a CUDA graph at its
//! key's second step and replayed after (`step.rs`, `step_graph.rs`): the
//! small inputs of every call are staged at fixed places of one device
//! arena, so a replay only copies what changed and launches the graph.
//!
//! Files: `tensors.rs` (the trait's types), `ops_impl.rs` (the trait),
//! `products.rs` (matmuls: decode or prefill), `attend.rs` (attention),
//! `step.rs` (graphs and the step arena).

mod attend;
mod ops_impl;
mod products;
mod scratch;
mod step;
mod step_state;
mod tensors;
mod weight_refs;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;

use super::buffer::CudaMemory;
use super::capture_gate::CaptureGate;
use super::device::{open, CudaDevice};
use super::weight_table::{WeightTable, DEFAULT_SLOTS};
use super::weight_tiers::WeightTiers;
use super::CudaError;
use crate::KernelError;

pub use tensors::{CudaActivations, CudaKvStore, CudaMatrix, CudaVector};

/// How a [`CudaBackend`] is set up.
#[derive(Clone, Debug)]
pub struct CudaConfig {
    /// The GPU (`--device cuda:N`).
    pub ordinal: usize,
    /// Matrices the weight table can name.
    pub weight_slots: usize,
    /// Bytes of weight matrices kept in pinned host memory when the engine
    /// demotes them from the device ([`crate::Backend::demote`]); past it
    /// a demoted checkpoint goes to disk.
    pub host_tier_bytes: usize,
}

/// [`CudaConfig::host_tier_bytes`] unless configured: room for a few 7B
/// checkpoints at 4 to 8 bits in pinned memory.
pub const DEFAULT_HOST_TIER_BYTES: usize = 32 << 30;

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            ordinal: 0,
            weight_slots: DEFAULT_SLOTS,
            host_tier_bytes: DEFAULT_HOST_TIER_BYTES,
        }
    }
}

/// The backend; see the module documentation.
pub struct CudaBackend {
    dev: CudaDevice,
    memory: CudaMemory,
    /// The weight table, and where each matrix lies (device or pinned
    /// host memory).
    tiers: WeightTiers<CudaMemory>,
    blas: CudaBlas,
    /// cuBLAS's workspace (see [`BLAS_WORKSPACE`]); declared after `blas`,
    /// so dropped after it.
    _blas_workspace: cudarc::driver::CudaSlice<u8>,
    /// Buffers the products reuse across calls (q8_1 activations, F16
    /// weights and activations for cuBLAS), held for a whole
    /// `matmul_many`: the backend's only lock.
    scratch: Mutex<scratch::Scratch>,
    /// Graphs, the step arena, the current step's mode.
    step: Mutex<step_state::StepState>,
    /// Holds other threads' stream work back during a capture.
    gate: Arc<CaptureGate>,
    /// Whether a capture is open (on the thread that holds the gate).
    capturing: AtomicBool,
}

impl CudaBackend {
    /// Opens GPU `config.ordinal`, or says in one line why it cannot.
    pub fn open(config: CudaConfig) -> Result<CudaBackend, CudaError> {
        let dev = open(config.ordinal)?;
        // SAFETY: everything of the backend runs on its one stream, in
        // order, so cudarc's cross-stream events are not needed; buffers
        // made from now on record none (a capture must not wait on them).
        unsafe { dev.context().disable_event_tracking() };
        let gate = Arc::new(CaptureGate::default());
        let memory = CudaMemory::gated(dev.stream().clone(), Arc::clone(&gate));
        let weights = WeightTable::new(memory.clone(), config.weight_slots)?;
        let tiers = WeightTiers::new(memory.clone(), weights, config.host_tier_bytes);
        let blas = CudaBlas::new(dev.stream().clone()).map_err(|e| CudaError::Driver {
            op: "cublasCreate",
            detail: format!("{e:?}"),
        })?;
        let workspace = set_blas_workspace(&dev, &blas)?;
        Ok(CudaBackend {
            dev,
            memory,
            tiers,
            blas,
            _blas_workspace: workspace,
            scratch: Mutex::new(scratch::Scratch::default()),
            step: Mutex::new(step_state::StepState::default()),
            gate,
            capturing: AtomicBool::new(false),
        })
    }

    /// The GPU.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// The weight table's address (what a captured graph holds).
    pub fn weight_table(&self) -> &WeightTable<CudaMemory> {
        self.tiers.table()
    }
}

/// Bytes of cuBLAS's workspace: NVIDIA's advice for Hopper (32 MiB; 4 MiB
/// would do before it). Set once at open, so that a product of more than
/// [`products::DECODE_MAX_ROWS`] rows inside a captured step allocates
/// nothing: cuBLAS would otherwise take its workspace from the driver,
/// which a capture refuses.
pub const BLAS_WORKSPACE: usize = 32 << 20;

fn set_blas_workspace(
    dev: &CudaDevice,
    blas: &CudaBlas,
) -> Result<cudarc::driver::CudaSlice<u8>, CudaError> {
    use cudarc::driver::DevicePtr;
    let buf = dev
        .stream()
        .alloc_zeros::<u8>(BLAS_WORKSPACE)
        .map_err(super::error::driver("cuMemAlloc (cuBLAS workspace)"))?;
    let ptr = buf.device_ptr(dev.stream()).0;
    // SAFETY: the handle is live; the buffer holds BLAS_WORKSPACE bytes and
    // outlives the handle (the backend drops `blas` first).
    unsafe {
        cudarc::cublas::sys::cublasSetWorkspace_v2(
            *blas.handle(),
            ptr as *mut std::ffi::c_void,
            BLAS_WORKSPACE,
        )
    }
    .result()
    .map_err(|e| CudaError::Driver {
        op: "cublasSetWorkspace",
        detail: format!("{e:?}"),
    })?;
    Ok(buf)
}

/// A CUDA failure as the backend trait reports it.
pub(crate) fn device_err(e: CudaError) -> KernelError {
    match e {
        CudaError::Layout(detail) => KernelError::Shape { op: "cuda", detail },
        other => KernelError::Device(other.to_string()),
    }
}

/// A driver failure in `op`.
pub(crate) fn driver_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KernelError {
    move |e| KernelError::Device(format!("{op}: {e:?}"))
}

fn poisoned(what: &str) -> KernelError {
    KernelError::Device(format!("a thread panicked while holding the {what}"))
}
