//! The CUDA backend's parts that do not depend on the backend trait:
//! kernel sources and images, device discovery, memory, the weight pointer
//! table, uploads and residency tiers.
//!
//! The kernels themselves are CUDA C in `kernels/cuda/` (see its
//! `budgets.txt` for their resource limits), compiled ahead of time by
//! `scripts/build-cuda-kernels.sh` and embedded by `build.rs` when the
//! `cuda` feature is on. Everything here but the device parts (`device`,
//! `registry`, `buffer`, behind the feature) compiles and is tested on
//! every build: the host-side logic runs over [`HostMemory`], a working
//! stand-in for device memory, and the block decoders and dot products of
//! the kernels are compiled for the host and checked bit for bit against
//! the CPU backend (`host_harness`).
//!
//! Without the feature, [`open`] returns [`CudaError::NotCompiled`]; on a
//! machine without a driver or GPU it returns a one-line error
//! ([`CudaError::NoDriver`], [`CudaError::NoDevice`]), never a panic.
//!
//! ```
//! use switchyard_kernels::cuda;
//! match cuda::open(0) {
//!     Ok(device) => println!("{}", device.describe()),
//!     Err(e) => println!("no CUDA: {e}"),
//! }
//! ```

pub mod attention_plan;
pub mod capture_gate;
pub mod copy_stream;
mod error;
pub mod gemm_pointers;
pub mod graph_cache;
pub mod kernel_names;
pub mod kv_pool;
pub mod kv_units;
pub mod memory;
pub mod pointer_table;
pub mod residency;
pub mod sources;
pub mod step_arena;
pub mod step_graph;
pub mod target;
pub mod upload;
pub mod weight_table;
pub mod weight_tiers;

#[cfg(test)]
mod gate_tests;
#[cfg(test)]
mod graph_swap_tests;
#[cfg(test)]
mod host_harness;

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod buffer;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod ops_layers;
#[cfg(feature = "cuda")]
mod registry;

#[cfg(not(feature = "cuda"))]
mod device_stub;
#[cfg(not(feature = "cuda"))]
use device_stub as device;

#[cfg(feature = "cuda")]
pub use backend::{CudaActivations, CudaBackend, CudaConfig, CudaKvStore, CudaMatrix, CudaVector};
#[cfg(feature = "cuda")]
pub use buffer::CudaMemory;
pub use copy_stream::CopyStream;
pub use device::{open, CudaDevice};
pub use error::CudaError;
pub use memory::{DeviceMemory, HostMemory};
pub use pointer_table::PointerTable;
pub use residency::{Budgets, Readiness, Residency, ResidentTable, Tier};
pub use upload::{SlotLayout, WeightImage};
pub use weight_tiers::{TieredWeight, WeightTiers};
