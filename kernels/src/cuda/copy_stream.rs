//! Copies up to the device on a stream of their own, from host memory a
//! copy can read while other work runs (pinned on a GPU): the next batch's
//! checkpoint moves up while the current batch computes, and is used only
//! once its copy has landed (`residency.rs`).
//!
//! [`HostMemory`] implements it with a copy queue that runs only when
//! asked ([`HostMemory::run_copies`], or [`CopyStream::wait`] up to one
//! copy), standing in for a stream that runs beside the host: until a copy
//! runs, its destination holds what it held before, exactly what a kernel
//! reading it too early would see. The CUDA build implements it over a
//! second stream, pinned host memory and an event per copy (`buffer.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::memory::{DeviceMemory, HostBuffer, HostMemory, QueuedCopy};
use super::CudaError;

/// Asynchronous copies between a device's memory and host memory.
pub trait CopyStream: DeviceMemory {
    /// Host bytes a copy up reads while other work runs.
    type Pinned: Send;
    /// A copy in flight.
    type Copy: Send;

    /// `bytes` in host memory a copy up can read.
    fn pin(&self, bytes: &[u8]) -> Result<Self::Pinned, CudaError>;
    /// Bytes of `pinned`.
    fn pinned_len(pinned: &Self::Pinned) -> usize;
    /// Starts copying `src` to the start of `buf` on the copy stream and
    /// returns at once: both must live until the copy has landed.
    fn copy_up(&self, buf: &mut Self::Buffer, src: &Self::Pinned) -> Result<Self::Copy, CudaError>;
    /// Whether `copy` has landed (never waits).
    fn landed(&self, copy: &Self::Copy) -> Result<bool, CudaError>;
    /// Waits until `copy` has landed.
    fn wait(&self, copy: &Self::Copy) -> Result<(), CudaError>;
    /// `buf`'s bytes in new host memory (waited for).
    fn copy_down(&self, buf: &Self::Buffer) -> Result<Self::Pinned, CudaError>;
}

impl HostMemory {
    /// Runs up to `n` of the copies queued on the copy stream, oldest
    /// first (the stream making progress beside the host); how many ran.
    pub fn run_copies(&self, n: usize) -> usize {
        self.copies().run(n)
    }

    /// Copies queued and not yet run.
    pub fn pending_copies(&self) -> usize {
        self.copies().len()
    }
}

/// A copy of [`HostMemory`]'s stream.
pub struct HostCopy {
    landed: Arc<AtomicBool>,
}

impl CopyStream for HostMemory {
    type Pinned = Arc<Vec<u8>>;
    type Copy = HostCopy;

    fn pin(&self, bytes: &[u8]) -> Result<Arc<Vec<u8>>, CudaError> {
        Ok(Arc::new(bytes.to_vec()))
    }

    fn pinned_len(pinned: &Arc<Vec<u8>>) -> usize {
        pinned.len()
    }

    fn copy_up(&self, buf: &mut HostBuffer, src: &Arc<Vec<u8>>) -> Result<HostCopy, CudaError> {
        let dst = buf.shared_data();
        let size = dst.lock().map(|d| d.len()).unwrap_or(0);
        if src.len() > size {
            return Err(CudaError::OutOfBounds {
                offset: 0,
                len: src.len(),
                size,
            });
        }
        let landed = Arc::new(AtomicBool::new(false));
        self.copies().push(QueuedCopy {
            dst,
            src: Arc::clone(src),
            landed: Arc::clone(&landed),
        })?;
        Ok(HostCopy { landed })
    }

    fn landed(&self, copy: &HostCopy) -> Result<bool, CudaError> {
        Ok(copy.landed.load(Ordering::SeqCst))
    }

    fn wait(&self, copy: &HostCopy) -> Result<(), CudaError> {
        while !copy.landed.load(Ordering::SeqCst) {
            if self.copies().run(1) == 0 {
                return Err(CudaError::Driver {
                    op: "copy stream",
                    detail: "waited for a copy that was never queued".into(),
                });
            }
        }
        Ok(())
    }

    fn copy_down(&self, buf: &HostBuffer) -> Result<Arc<Vec<u8>>, CudaError> {
        let mut out = vec![0u8; buf.len()];
        self.read(buf, 0, &mut out)?;
        Ok(Arc::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_lands_only_when_the_stream_runs_it() {
        let mem = HostMemory::new(1 << 16);
        let mut buf = mem.alloc(8).unwrap();
        let src = mem.pin(&[7; 8]).unwrap();
        let copy = mem.copy_up(&mut buf, &src).unwrap();
        // Queued: the device still holds zeros, as a kernel would read.
        assert!(!mem.landed(&copy).unwrap());
        assert_eq!(mem.read_at(mem.address(&buf), 8), Some(vec![0; 8]));
        assert_eq!(mem.pending_copies(), 1);
        assert_eq!(mem.run_copies(5), 1);
        assert!(mem.landed(&copy).unwrap());
        assert_eq!(mem.read_at(mem.address(&buf), 8), Some(vec![7; 8]));
        // Waiting runs the queue up to the copy, in order.
        let (mut a, mut b) = (mem.alloc(4).unwrap(), mem.alloc(4).unwrap());
        let first = mem.copy_up(&mut a, &mem.pin(&[1; 4]).unwrap()).unwrap();
        let second = mem.copy_up(&mut b, &mem.pin(&[2; 4]).unwrap()).unwrap();
        mem.wait(&first).unwrap();
        assert!(!mem.landed(&second).unwrap());
        mem.wait(&second).unwrap();
        assert_eq!(*mem.copy_down(&b).unwrap(), vec![2; 4]);
        // A copy bigger than its destination is refused.
        assert!(mem.copy_up(&mut a, &src).is_err());
    }
}
