//! Repacked weights on 2 MB pages: one arena per backend hands out their
//! buffers from huge-page-aligned chunks.
//!
//! Decode streams every weight once per step (about 100 MB for SmolLM2),
//! far more than L3 holds. On 4 KB pages that is a TLB miss every 4 KB
//! and, because the hardware prefetchers stop at page boundaries, a fresh
//! demand miss at the start of every page: in profiles of batched decode
//! a third of the group kernel's samples sat on the first weight loads of
//! a block. Linux backs anonymous memory with 2 MB pages when asked
//! (`madvise(MADV_HUGEPAGE)`; `transparent_hugepage=madvise` is the common
//! default), but only whole, aligned 2 MB pages, and most matrices of a
//! small model are a few hundred KB: alone, each would sit on 4 KB pages.
//! So matrices share chunks.
//!
//! A chunk is freed when the last matrix in it is dropped. Matrices of a
//! checkpoint that is unloaded while another loads can share a chunk;
//! what that keeps alive is bounded by one chunk ([`CHUNK_BYTES`]) per
//! chunk still in use.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

const HUGE_PAGE: usize = 2 << 20;
/// Bytes of a shared chunk; a buffer of at least half of it gets a chunk
/// of its own (rounded up to whole huge pages), so at most half a chunk is
/// left unused when a buffer does not fit in the current one.
const CHUNK_BYTES: usize = 2 * HUGE_PAGE;
/// Alignment of every buffer: a cache line, for aligned full-width loads.
pub(crate) const ALIGN: usize = 64;

/// One allocation, huge-page aligned.
struct Chunk {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a chunk is plain memory; `ArenaBytes` hands out disjoint ranges
// of it, each reached only through its own `&`/`&mut` borrows.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// `bytes` (a multiple of `HUGE_PAGE`) of zeroed memory, advised huge
    /// before it is first touched.
    fn new(bytes: usize) -> Chunk {
        let layout = match Layout::from_size_align(bytes, HUGE_PAGE) {
            Ok(layout) => layout,
            // Only a size near usize::MAX gets here; `Vec` would panic too.
            Err(_) => panic!("weight arena: {bytes} bytes cannot be allocated"),
        };
        // SAFETY: `bytes` is non-zero (callers ask for whole huge pages).
        let Some(ptr) = NonNull::new(unsafe { alloc(layout) }) else {
            handle_alloc_error(layout)
        };
        advise_huge(ptr.as_ptr(), bytes);
        // SAFETY: the allocation is `bytes` long. Zeroing is the first
        // touch, so the pages fault in huge where the advice was taken.
        unsafe { ptr.as_ptr().write_bytes(0, bytes) };
        Chunk { ptr, layout }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `Chunk::new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A zeroed buffer of `len` bytes, [`ALIGN`]-aligned, in an arena chunk.
pub(crate) struct ArenaBytes {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl ArenaBytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset..offset + len` lies in the chunk and belongs to
        // this buffer alone; the chunk lives as long as `self.chunk`.
        unsafe { std::slice::from_raw_parts(self.chunk.ptr.as_ptr().add(self.offset), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow unique,
        // since no other buffer covers these bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.chunk.ptr.as_ptr().add(self.offset), self.len)
        }
    }
}

/// Hands out weight buffers from shared huge-page chunks.
#[derive(Default)]
pub(crate) struct WeightArena {
    /// The chunk being filled and the bytes of it handed out.
    current: Mutex<Option<(Arc<Chunk>, usize)>>,
}

impl WeightArena {
    /// A zeroed, [`ALIGN`]-aligned buffer of `len` bytes.
    pub(crate) fn alloc(&self, len: usize) -> ArenaBytes {
        let len = len.max(1);
        if len >= CHUNK_BYTES / 2 {
            let chunk = Arc::new(Chunk::new(len.next_multiple_of(HUGE_PAGE)));
            return ArenaBytes {
                chunk,
                offset: 0,
                len,
            };
        }
        // A poisoned lock only means another load panicked mid-call; the
        // bump state is still consistent (it is updated in one store).
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let (chunk, used) = match current.take() {
            Some((chunk, used)) if used + len <= CHUNK_BYTES => (chunk, used),
            _ => (Arc::new(Chunk::new(CHUNK_BYTES)), 0),
        };
        let end = (used + len).next_multiple_of(ALIGN);
        *current = Some((Arc::clone(&chunk), end));
        ArenaBytes {
            chunk,
            offset: used,
            len,
        }
    }
}

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, bytes: usize) {
    // SAFETY: the range is one allocation of ours, huge-page aligned;
    // MADV_HUGEPAGE changes only how its pages are backed, never their
    // contents. Refused (THP off, an old kernel), it changes nothing, and
    // the buffers work the same on 4 KB pages.
    unsafe { libc::madvise(ptr.cast(), bytes, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_disjoint() {
        let arena = WeightArena::default();
        let sizes = [
            1usize,
            63,
            64,
            5000,
            300_000,
            CHUNK_BYTES / 2 - 1,
            CHUNK_BYTES / 2,
            3_000_001,
        ];
        let mut buffers: Vec<ArenaBytes> = sizes.iter().map(|&n| arena.alloc(n)).collect();
        for (i, (b, &n)) in buffers.iter_mut().zip(&sizes).enumerate() {
            assert_eq!(b.as_slice().len(), n);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0, "buffer {i}");
            assert!(
                b.as_slice().iter().all(|&x| x == 0),
                "buffer {i} not zeroed"
            );
            b.as_mut_slice().fill(i as u8 + 1);
        }
        // Every buffer still holds its own fill: no two overlap.
        for (i, b) in buffers.iter().enumerate() {
            assert!(
                b.as_slice().iter().all(|&x| x == i as u8 + 1),
                "buffer {i} overwritten"
            );
        }
    }
}
