//! A handle to one stored tensor that gives its bytes back when dropped.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters shared by a store and every tensor it handed out.
#[derive(Debug, Default)]
pub(super) struct Residency {
    pub(super) bytes: AtomicU64,
    pub(super) tensors: AtomicU64,
}

/// One tensor in the store, shared by every checkpoint that uses it.
///
/// Derefs to the backend's tensor, so model code uses it as `&B::Matrix`.
pub struct Stored<T> {
    value: T,
    bytes: u64,
    residency: Arc<Residency>,
}

/// A checkpoint's handle to a stored tensor.
pub type Shared<T> = Arc<Stored<T>>;

impl<T> Stored<T> {
    pub(super) fn new(value: T, bytes: u64, residency: Arc<Residency>) -> Self {
        residency.bytes.fetch_add(bytes, Ordering::AcqRel);
        residency.tensors.fetch_add(1, Ordering::AcqRel);
        Stored {
            value,
            bytes,
            residency,
        }
    }

    /// Bytes this tensor occupies.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl<T> Deref for Stored<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> Drop for Stored<T> {
    fn drop(&mut self) {
        self.residency.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.residency.tensors.fetch_sub(1, Ordering::AcqRel);
    }
}
