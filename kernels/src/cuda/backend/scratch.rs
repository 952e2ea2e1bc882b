//! The device buffers a backend's products reuse across calls.

use cudarc::driver::CudaSlice;

/// Buffers reused across calls, grown as needed: q8_1 activations and their
/// scales for the decode products, F16 weights and activations for cuBLAS.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(super) q: Option<CudaSlice<i8>>,
    pub(super) ds: Option<CudaSlice<f32>>,
    pub(super) w16: Option<CudaSlice<u16>>,
    pub(super) x16: Option<CudaSlice<u16>>,
}
