//! [`DisjointSlice`]: one output buffer written by many pool tasks.

/// A mutable slice that several tasks of one job write at disjoint places.
///
/// The pool hands each task a shared reference to the job closure, so a
/// closure cannot hold `&mut` to its output; this wrapper keeps the slice's
/// pointer and length and lets each task borrow the part it alone writes.
pub(crate) struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: the wrapper only hands out `&mut` to ranges that callers promise
// are disjoint between tasks (see `range`), so sharing it across threads is
// like sending disjoint `&mut [T]`s, which needs `T: Send`.
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    pub(crate) fn new(slice: &'a mut [T]) -> Self {
        DisjointSlice {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// A view of the `len` elements at `ptr`, borrowed for `'a`.
    ///
    /// # Safety
    /// They must stay valid for `'a`, and every borrow taken through the
    /// view must obey [`DisjointSlice::range`]'s and
    /// [`DisjointSlice::get`]'s rules together with every other view of
    /// them.
    pub(crate) unsafe fn from_raw(ptr: *mut T, len: usize) -> Self {
        DisjointSlice {
            ptr,
            len,
            _borrow: std::marker::PhantomData,
        }
    }

    /// The elements `start..start + len`.
    ///
    /// # Safety
    /// No two live borrows returned by this method (on any thread) may
    /// overlap.
    ///
    /// # Panics
    /// When the range is out of bounds: callers compute ranges from shapes
    /// validated beforehand, so this is an internal invariant.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "DisjointSlice range {start}+{len} outside {}",
            self.len
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's
        // promise; the borrow of the original slice lives for 'a.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

impl<T> DisjointSlice<'_, T> {
    /// The elements `start..start + len`, to read.
    ///
    /// # Safety
    /// No live borrow from [`DisjointSlice::range`] (on any thread) may
    /// overlap them.
    ///
    /// # Panics
    /// When the range is out of bounds (an internal invariant, as in `range`).
    pub(crate) unsafe fn get(&self, start: usize, len: usize) -> &[T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "DisjointSlice range {start}+{len} outside {}",
            self.len
        );
        // SAFETY: in bounds (checked above); the caller promises no
        // overlapping `&mut` is live.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }

    /// As [`DisjointSlice::get`], bounds checked in debug builds only: for
    /// the group kernels' tile walk, which builds eight rows' views per
    /// block of groups (a checked call each showed up in profiles).
    ///
    /// # Safety
    /// As for `get`, and `start + len` must not exceed the length.
    #[inline(always)]
    pub(crate) unsafe fn get_unchecked(&self, start: usize, len: usize) -> &[T] {
        debug_assert!(start <= self.len && len <= self.len - start);
        // SAFETY: the caller's promises.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// No other task may read or write `index` during this job.
    ///
    /// # Panics
    /// When `index` is out of bounds (an internal invariant, as in `range`).
    pub(crate) unsafe fn write(&self, index: usize, value: T) {
        assert!(
            index < self.len,
            "DisjointSlice index {index} outside {}",
            self.len
        );
        // SAFETY: in bounds; exclusivity is the caller's promise.
        unsafe { self.ptr.add(index).write(value) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ThreadPool;

    #[test]
    fn disjoint_ranges_fill_a_buffer() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            let mut out = vec![0usize; 1001];
            let shared = DisjointSlice::new(&mut out);
            pool.for_each_range(1001, 17, &|range| {
                // SAFETY: for_each_range's ranges do not overlap.
                let part = unsafe { shared.range(range.start, range.len()) };
                for (offset, slot) in part.iter_mut().enumerate() {
                    *slot = (range.start + offset) * 2;
                }
            });
            assert!(out.iter().enumerate().all(|(i, v)| *v == i * 2));
        }
    }
}
