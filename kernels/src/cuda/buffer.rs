//! [`DeviceMemory`] over cudarc: device buffers of bytes on the device's
//! stream. Host-to-device copies from pageable memory return once the
//! source is staged; reads synchronize the stream before returning. Every
//! call waits while another thread captures a graph on the stream
//! ([`CaptureGate`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::capture_gate::CaptureGate;
use super::error::driver;
use super::memory::DeviceMemory;
use super::CudaError;

#[derive(Clone)]
pub struct CudaMemory {
    stream: Arc<CudaStream>,
    gate: Arc<CaptureGate>,
}

impl CudaMemory {
    pub fn new(stream: Arc<CudaStream>) -> CudaMemory {
        CudaMemory::gated(stream, Arc::default())
    }

    /// Memory whose calls pass `gate` first (the backend's).
    pub fn gated(stream: Arc<CudaStream>, gate: Arc<CaptureGate>) -> CudaMemory {
        CudaMemory { stream, gate }
    }
}

fn range(
    buf: &CudaSlice<u8>,
    offset: usize,
    len: usize,
) -> Result<std::ops::Range<usize>, CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.len() => Ok(offset..end),
        _ => Err(CudaError::OutOfBounds {
            offset,
            len,
            size: buf.len(),
        }),
    }
}

impl DeviceMemory for CudaMemory {
    type Buffer = CudaSlice<u8>;

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, CudaError> {
        let _pass = self.gate.pass();
        self.stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| match e.0 {
                cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => CudaError::OutOfMemory {
                    bytes,
                    free: self.free_bytes(),
                },
                _ => driver("cuMemAlloc")(e),
            })
    }

    fn write(&self, buf: &mut CudaSlice<u8>, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        let r = range(buf, offset, data.len())?;
        let _pass = self.gate.pass();
        let mut view = buf.slice_mut(r);
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(driver("cuMemcpyHtoD"))
    }

    fn read(&self, buf: &CudaSlice<u8>, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let r = range(buf, offset, out.len())?;
        let _pass = self.gate.pass();
        let view = buf.slice(r);
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(driver("cuMemcpyDtoH"))?;
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    fn copy_within(
        &self,
        buf: &mut CudaSlice<u8>,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        range(buf, src, len)?;
        range(buf, dst, len)?;
        if src < dst + len && dst < src + len {
            return Err(CudaError::Layout(format!(
                "copy of {len} bytes from {src} to {dst} overlaps itself"
            )));
        }
        let _pass = self.gate.pass();
        let base = self.address(buf);
        // SAFETY: both ranges lie inside `buf` (checked) and do not
        // overlap; the copy is ordered on the buffer's stream.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                base + dst as u64,
                base + src as u64,
                len,
                self.stream.cu_stream(),
            )
        }
        .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn address(&self, buf: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        ptr
    }

    fn free_bytes(&self) -> usize {
        self.stream
            .context()
            .mem_get_info()
            .map(|(free, _)| free)
            .unwrap_or(0)
    }
}
