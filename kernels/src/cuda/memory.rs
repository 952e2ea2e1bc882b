//! Device memory as the host-side logic sees it, and its stand-in in host
//! memory.
//!
//! Uploads, pointer tables, budgets and tier moves only allocate, copy and
//! take addresses; [`DeviceMemory`] is that much. The CUDA build implements
//! it over cudarc (`buffer.rs`); [`HostMemory`] implements it over host
//! vectors with fake device addresses and a capacity, so that the same
//! logic runs, and is tested, on a machine without a GPU. It is a working
//! memory, not a mock: bytes written are read back, and an address can be
//! resolved to the bytes behind it as a kernel would ([`HostMemory::read_at`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::CudaError;

/// Allocation and copies of one device.
pub trait DeviceMemory: Clone {
    type Buffer;
    /// A zeroed buffer of `bytes`.
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer, CudaError>;
    /// Copies `data` into `buf` at `offset`.
    fn write(&self, buf: &mut Self::Buffer, offset: usize, data: &[u8]) -> Result<(), CudaError>;
    /// Copies `out.len()` bytes of `buf` from `offset` into `out`.
    fn read(&self, buf: &Self::Buffer, offset: usize, out: &mut [u8]) -> Result<(), CudaError>;
    /// Copies `len` bytes of `buf` from `src` to `dst` on the device (the
    /// ranges must not overlap): a KV block's positions into another.
    fn copy_within(
        &self,
        buf: &mut Self::Buffer,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), CudaError>;
    /// The buffer's device address (what kernels and pointer tables hold).
    fn address(&self, buf: &Self::Buffer) -> u64;
    /// Bytes free on the device now.
    fn free_bytes(&self) -> usize;
}

/// Device allocations are aligned so; the stand-in keeps the same rule.
pub const DEVICE_ALIGN: u64 = 256;

fn check_range(offset: usize, len: usize, size: usize) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::OutOfBounds { offset, len, size }),
    }
}

/// Host memory posing as a device of `capacity` bytes.
#[derive(Clone)]
pub struct HostMemory {
    inner: Arc<HostInner>,
}

struct HostInner {
    capacity: usize,
    used: AtomicUsize,
    next_address: AtomicU64,
    /// Live buffers by base address, for [`HostMemory::read_at`].
    live: Mutex<BTreeMap<u64, Arc<Mutex<Vec<u8>>>>>,
    /// The copy stream's queue (`copy_stream.rs`).
    copies: CopyQueue,
}

/// A buffer of [`HostMemory`]; dropping it frees its bytes.
pub struct HostBuffer {
    address: u64,
    data: Arc<Mutex<Vec<u8>>>,
    owner: Arc<HostInner>,
}

impl HostBuffer {
    /// Its bytes, shared with a queued copy that writes them later.
    pub(super) fn shared_data(&self) -> Arc<Mutex<Vec<u8>>> {
        Arc::clone(&self.data)
    }

    pub fn len(&self) -> usize {
        self.data.lock().map(|d| d.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let len = self.data.lock().map(|d| d.len()).unwrap_or(0);
        self.owner.used.fetch_sub(len, Ordering::Relaxed);
        if let Ok(mut live) = self.owner.live.lock() {
            live.remove(&self.address);
        }
    }
}

impl HostMemory {
    pub fn new(capacity: usize) -> HostMemory {
        HostMemory {
            inner: Arc::new(HostInner {
                capacity,
                used: AtomicUsize::new(0),
                // Far from zero, so a table slot left at 0 never resolves.
                next_address: AtomicU64::new(0x7f00_0000_0000),
                live: Mutex::new(BTreeMap::new()),
                copies: CopyQueue::default(),
            }),
        }
    }

    pub(super) fn copies(&self) -> &CopyQueue {
        &self.inner.copies
    }

    /// Bytes allocated now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// The `len` bytes at device address `address`, as a kernel following a
    /// pointer would read them; `None` when they are not inside one live
    /// buffer.
    pub fn read_at(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        let live = self.inner.live.lock().ok()?;
        let (base, data) = live.range(..=address).next_back()?;
        let data = data.lock().ok()?;
        let offset = usize::try_from(address - base).ok()?;
        data.get(offset..offset.checked_add(len)?)
            .map(<[u8]>::to_vec)
    }

    /// Writes `data` at device address `address`, as a kernel storing
    /// through a pointer would; `None` when the bytes are not inside one
    /// live buffer.
    pub fn write_at(&self, address: u64, data: &[u8]) -> Option<()> {
        let live = self.inner.live.lock().ok()?;
        let (base, buf) = live.range(..=address).next_back()?;
        let mut buf = buf.lock().ok()?;
        let offset = usize::try_from(address - base).ok()?;
        buf.get_mut(offset..offset.checked_add(data.len())?)?
            .copy_from_slice(data);
        Some(())
    }
}

impl DeviceMemory for HostMemory {
    type Buffer = HostBuffer;

    fn alloc(&self, bytes: usize) -> Result<HostBuffer, CudaError> {
        let inner = &self.inner;
        let reserved = inner
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|n| *n <= inner.capacity)
            });
        if let Err(used) = reserved {
            return Err(CudaError::OutOfMemory {
                bytes,
                free: inner.capacity.saturating_sub(used),
            });
        }
        let span = (bytes as u64).max(1).div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN;
        let address = inner.next_address.fetch_add(span, Ordering::Relaxed);
        let data = Arc::new(Mutex::new(vec![0u8; bytes]));
        if let Ok(mut live) = inner.live.lock() {
            live.insert(address, data.clone());
        }
        Ok(HostBuffer {
            address,
            data,
            owner: inner.clone(),
        })
    }

    fn write(&self, buf: &mut HostBuffer, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        let mut dst = buf.data.lock().map_err(|_| poisoned())?;
        check_range(offset, data.len(), dst.len())?;
        dst[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(&self, buf: &HostBuffer, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let src = buf.data.lock().map_err(|_| poisoned())?;
        check_range(offset, out.len(), src.len())?;
        out.copy_from_slice(&src[offset..offset + out.len()]);
        Ok(())
    }

    fn copy_within(
        &self,
        buf: &mut HostBuffer,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let mut data = buf.data.lock().map_err(|_| poisoned())?;
        check_range(src, len, data.len())?;
        check_range(dst, len, data.len())?;
        if src < dst + len && dst < src + len {
            return Err(CudaError::Layout(format!(
                "copy of {len} bytes from {src} to {dst} overlaps itself"
            )));
        }
        data.copy_within(src..src + len, dst);
        Ok(())
    }

    fn address(&self, buf: &HostBuffer) -> u64 {
        buf.address
    }

    fn free_bytes(&self) -> usize {
        self.inner.capacity.saturating_sub(self.used())
    }
}

/// One copy in the stand-in's queue.
pub(super) struct QueuedCopy {
    pub(super) dst: Arc<Mutex<Vec<u8>>>,
    pub(super) src: Arc<Vec<u8>>,
    pub(super) landed: Arc<AtomicBool>,
}

/// The stand-in's copy stream (`copy_stream.rs`): copies in the order
/// they were queued, run only when asked.
#[derive(Default)]
pub(super) struct CopyQueue {
    queue: Mutex<VecDeque<QueuedCopy>>,
}

impl CopyQueue {
    pub(super) fn push(&self, copy: QueuedCopy) -> Result<(), CudaError> {
        self.queue.lock().map_err(|_| poisoned())?.push_back(copy);
        Ok(())
    }

    /// Runs up to `n` queued copies; how many ran.
    pub(super) fn run(&self, n: usize) -> usize {
        let mut ran = 0;
        while ran < n {
            let next = self.queue.lock().ok().and_then(|mut q| q.pop_front());
            let Some(c) = next else { break };
            if let Ok(mut dst) = c.dst.lock() {
                dst[..c.src.len()].copy_from_slice(&c.src);
            }
            c.landed.store(true, Ordering::SeqCst);
            ran += 1;
        }
        ran
    }

    pub(super) fn len(&self) -> usize {
        self.queue.lock().map(|q| q.len()).unwrap_or(0)
    }
}

fn poisoned() -> CudaError {
    CudaError::Driver {
        op: "host memory",
        detail: "a thread panicked while holding a buffer".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_addresses_resolve() {
        let mem = HostMemory::new(4096);
        let mut a = mem.alloc(100).unwrap();
        let b = mem.alloc(10).unwrap();
        mem.write(&mut a, 10, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 4];
        mem.read(&a, 9, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3]);
        assert_eq!(mem.address(&a) % DEVICE_ALIGN, 0);
        assert_eq!(mem.read_at(mem.address(&a) + 11, 2), Some(vec![2, 3]));
        // Past a buffer's end is not inside it, even below the next one.
        assert_eq!(mem.read_at(mem.address(&a) + 99, 2), None);
        assert_eq!(mem.read_at(mem.address(&b), 10), Some(vec![0; 10]));
        mem.copy_within(&mut a, 10, 50, 3).unwrap();
        assert_eq!(mem.read_at(mem.address(&a) + 50, 4), Some(vec![1, 2, 3, 0]));
        assert!(mem.copy_within(&mut a, 10, 11, 3).is_err());
        assert!(mem.copy_within(&mut a, 98, 0, 3).is_err());
        assert!(matches!(
            mem.write(&mut a, 99, &[0, 0]),
            Err(CudaError::OutOfBounds {
                offset: 99,
                len: 2,
                size: 100
            })
        ));
    }

    #[test]
    fn capacity_is_enforced_and_freed_on_drop() {
        let mem = HostMemory::new(1000);
        let a = mem.alloc(600).unwrap();
        assert!(matches!(
            mem.alloc(500),
            Err(CudaError::OutOfMemory {
                bytes: 500,
                free: 400
            })
        ));
        let address = mem.address(&a);
        drop(a);
        assert_eq!(mem.used(), 0);
        assert_eq!(mem.read_at(address, 1), None);
        assert!(mem.alloc(1000).is_ok());
    }
}
