//! The types [`CudaBackend`](super::CudaBackend) gives the backend trait.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::super::buffer::CudaMemory;
use super::super::capture_gate::CaptureGate;
use super::super::kv_units::KvUnits;
use super::super::weight_table::WeightSlot;
use super::super::weight_tiers::TieredWeight;
use crate::{DType, KernelError};

/// A weight matrix in its checkpoint's block layout, on the device or
/// demoted to pinned host memory (`weight_tiers.rs`), with its slot in the
/// weight table. Dropped (on whichever thread unloads it) through the
/// capture gate: the slot (its entry zeroed) first, then the memory it
/// named, neither inside another thread's capture.
pub struct CudaMatrix {
    pub(super) weight: ManuallyDrop<TieredWeight<CudaMemory>>,
    pub(super) gate: Arc<CaptureGate>,
    pub(super) dtype: DType,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl Drop for CudaMatrix {
    fn drop(&mut self) {
        let _pass = self.gate.pass();
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.weight) }
    }
}

impl CudaMatrix {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Its slot in the backend's weight table.
    pub fn slot(&self) -> u32 {
        self.weight.slot()
    }
}

/// A small f32 vector on the device (a norm's weight, a bias), with its
/// slot in the weight table like a matrix: the kernels read it through
/// the table, so a captured step can run another checkpoint's. Dropped as
/// a matrix is.
pub struct CudaVector {
    pub(super) slot: ManuallyDrop<WeightSlot<CudaMemory>>,
    pub(super) buf: ManuallyDrop<CudaSlice<f32>>,
    pub(super) gate: Arc<CaptureGate>,
}

impl Drop for CudaVector {
    fn drop(&mut self) {
        let _pass = self.gate.pass();
        // SAFETY: each field is dropped once, here, and not used after.
        unsafe {
            ManuallyDrop::drop(&mut self.slot);
            ManuallyDrop::drop(&mut self.buf);
        }
    }
}

impl CudaVector {
    /// Its slot in the backend's weight table.
    pub fn slot(&self) -> u32 {
        self.slot.index()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// `rows × cols` f32 on the device. The trait's `activations` and
/// `resize` cannot fail, so a failed allocation is kept here (`buf`
/// `Err`) and named by the first operation that uses it.
pub struct CudaActivations {
    pub(super) buf: Result<CudaSlice<f32>, String>,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl CudaActivations {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn shape(&self) -> String {
        format!("{}×{}", self.rows, self.cols)
    }

    pub(super) fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub(super) fn buf(&self) -> Result<&CudaSlice<f32>, KernelError> {
        self.buf
            .as_ref()
            .map_err(|e| KernelError::Device(e.clone()))
    }

    pub(super) fn buf_mut(&mut self) -> Result<&mut CudaSlice<f32>, KernelError> {
        self.buf
            .as_mut()
            .map_err(|e| KernelError::Device(e.clone()))
    }
}

/// The KV store: the engine's blocks as runs of device units.
pub type CudaKvStore = KvUnits<CudaMemory>;
