//! [`DeviceMemory`] over cudarc: device buffers of bytes on the device's
//! stream. Host-to-device copies from pageable memory return once the
//! source is staged; reads synchronize the stream before returning. Every
//! call waits while another thread captures a graph on the stream
//! ([`CaptureGate`]). [`CopyStream`]: copies up from pinned host memory on
//! a second stream, each followed by an event that says when it landed.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};

use super::capture_gate::CaptureGate;
use super::copy_stream::CopyStream;
use super::error::driver;
use super::memory::DeviceMemory;
use super::CudaError;

#[derive(Clone)]
pub struct CudaMemory {
    stream: Arc<CudaStream>,
    gate: Arc<CaptureGate>,
    /// The copy stream of [`CopyStream`], made at its first copy.
    copies: Arc<OnceLock<Arc<CudaStream>>>,
}

impl CudaMemory {
    pub fn new(stream: Arc<CudaStream>) -> CudaMemory {
        CudaMemory::gated(stream, Arc::default())
    }

    /// Memory whose calls pass `gate` first (the backend's).
    pub fn gated(stream: Arc<CudaStream>, gate: Arc<CaptureGate>) -> CudaMemory {
        CudaMemory {
            stream,
            gate,
            copies: Arc::default(),
        }
    }

    fn copy_stream(&self) -> Result<&Arc<CudaStream>, CudaError> {
        if let Some(s) = self.copies.get() {
            return Ok(s);
        }
        let made = self
            .stream
            .context()
            .new_stream()
            .map_err(driver("cuStreamCreate (copy stream)"))?;
        Ok(self.copies.get_or_init(|| made))
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

impl CopyStream for CudaMemory {
    type Pinned = PinnedHostSlice<u8>;
    type Copy = CudaEvent;

    fn pin(&self, bytes: &[u8]) -> Result<PinnedHostSlice<u8>, CudaError> {
        let ctx = self.stream.context();
        // SAFETY: every byte is written just below, before any read.
        let mut pinned = unsafe { ctx.alloc_pinned::<u8>(bytes.len().max(1)) }
            .map_err(driver("cuMemHostAlloc"))?;
        let dst = pinned.as_mut_slice().map_err(driver("cuMemHostAlloc"))?;
        dst[..bytes.len()].copy_from_slice(bytes);
        Ok(pinned)
    }

    fn pinned_len(pinned: &PinnedHostSlice<u8>) -> usize {
        pinned.len()
    }

    fn copy_up(
        &self,
        buf: &mut CudaSlice<u8>,
        src: &PinnedHostSlice<u8>,
    ) -> Result<CudaEvent, CudaError> {
        let r = range(buf, 0, src.len())?;
        let copies = self.copy_stream()?;
        // The event recorded on the main stream (the buffer's allocation
        // is ordered there) must not fall inside another thread's capture.
        let _pass = self.gate.pass();
        copies
            .join(&self.stream)
            .map_err(driver("cuStreamWaitEvent (copy stream)"))?;
        let mut view = buf.slice_mut(r);
        copies
            .memcpy_htod(src, &mut view)
            .map_err(driver("cuMemcpyHtoDAsync (copy stream)"))?;
        copies
            .record_event(None)
            .map_err(driver("cuEventRecord (copy stream)"))
    }

    fn landed(&self, copy: &CudaEvent) -> Result<bool, CudaError> {
        copy.try_is_complete().map_err(driver("cuEventQuery"))
    }

    fn wait(&self, copy: &CudaEvent) -> Result<(), CudaError> {
        copy.synchronize().map_err(driver("cuEventSynchronize"))
    }

    fn copy_down(&self, buf: &CudaSlice<u8>) -> Result<PinnedHostSlice<u8>, CudaError> {
        let ctx = self.stream.context();
        // SAFETY: the copy below writes every byte before any read.
        let mut pinned =
            unsafe { ctx.alloc_pinned::<u8>(buf.len()) }.map_err(driver("cuMemHostAlloc"))?;
        let _pass = self.gate.pass();
        self.stream
            .memcpy_dtoh(buf, &mut pinned)
            .map_err(driver("cuMemcpyDtoH"))?;
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        Ok(pinned)
    }
}
