//! Content-addressed storage of backend tensors.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use switchyard_kernels::{Backend, DType};

use super::shared::{Residency, Shared, Stored};

/// What identifies a tensor's content: its type, its shape and a BLAKE3
/// hash of its bytes. Two tensors with the same key are the same tensor
/// (BLAKE3 is collision resistant, so a crafted file cannot alias another).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorKey {
    dtype: DType,
    shape: Vec<usize>,
    hash: [u8; 32],
}

impl TensorKey {
    /// The key of a tensor with these bytes.
    pub fn of(dtype: DType, shape: &[usize], data: &[u8]) -> TensorKey {
        TensorKey {
            dtype,
            shape: shape.to_vec(),
            hash: *blake3::hash(data).as_bytes(),
        }
    }

    /// The key of this tensor with `offset` added to every value (a
    /// Hugging Face Gemma norm weight, `1 + w`): another tensor, unless
    /// the offset is 0.
    pub fn offset_by(self, offset: f32) -> TensorKey {
        if offset == 0.0 {
            return self;
        }
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.hash);
        hasher.update(b"+offset");
        hasher.update(&offset.to_le_bytes());
        TensorKey {
            hash: *hasher.finalize().as_bytes(),
            ..self
        }
    }
}

/// Bytes and tensors held by a store right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes of every distinct tensor some checkpoint still uses.
    pub resident_bytes: u64,
    /// Distinct tensors some checkpoint still uses.
    pub tensors: u64,
}

/// Every tensor any loaded checkpoint uses, each stored once.
///
/// The store keeps weak references only: a tensor lives as long as some
/// checkpoint holds its [`Shared`] handle.
pub struct WeightStore<B: Backend> {
    matrices: Mutex<HashMap<TensorKey, Weak<Stored<B::Matrix>>>>,
    vectors: Mutex<HashMap<TensorKey, Weak<Stored<B::Vector>>>>,
    residency: Arc<Residency>,
}

impl<B: Backend> Default for WeightStore<B> {
    fn default() -> Self {
        WeightStore {
            matrices: Mutex::new(HashMap::new()),
            vectors: Mutex::new(HashMap::new()),
            residency: Arc::new(Residency::default()),
        }
    }
}

impl<B: Backend> WeightStore<B> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stored matrix with `key`, or the one `make` builds (`bytes` long),
    /// stored for the next checkpoint that has it. The flag says whether
    /// an existing tensor was reused.
    pub fn matrix<E>(
        &self,
        key: TensorKey,
        bytes: u64,
        make: impl FnOnce() -> Result<B::Matrix, E>,
    ) -> Result<(Shared<B::Matrix>, bool), E> {
        intern(lock(&self.matrices), &self.residency, key, bytes, make)
    }

    /// The stored vector with `key`, or the one `make` builds.
    pub fn vector<E>(
        &self,
        key: TensorKey,
        bytes: u64,
        make: impl FnOnce() -> Result<B::Vector, E>,
    ) -> Result<(Shared<B::Vector>, bool), E> {
        intern(lock(&self.vectors), &self.residency, key, bytes, make)
    }

    /// What the store holds now.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            resident_bytes: self.residency.bytes.load(Ordering::Acquire),
            tensors: self.residency.tensors.load(Ordering::Acquire),
        }
    }
}

/// A poisoned map is still consistent (entries are inserted whole), so a
/// panic elsewhere must not stop every later load.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn intern<T, E>(
    mut map: MutexGuard<'_, HashMap<TensorKey, Weak<Stored<T>>>>,
    residency: &Arc<Residency>,
    key: TensorKey,
    bytes: u64,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<(Arc<Stored<T>>, bool), E> {
    if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
        return Ok((existing, true));
    }
    let stored = Arc::new(Stored::new(make()?, bytes, residency.clone()));
    // Forget tensors no checkpoint uses any more before the map grows.
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, weak| weak.strong_count() > 0);
    }
    map.insert(key, Arc::downgrade(&stored));
    Ok((stored, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_kernels::{on_each_device, Backend, WeightView};

    fn matrix<B: Backend>(backend: &B, values: &[f32]) -> B::Matrix {
        let bytes = bytes::Bytes::copy_from_slice(bytemuck::cast_slice(values));
        backend
            .matrix(WeightView::new(DType::F32, 1, values.len(), bytes).unwrap())
            .unwrap()
    }

    fn identical_tensors_are_stored_once_and_freed_with_their_last_user<B: Backend>(
        backend: Arc<B>,
    ) {
        let store = WeightStore::<B>::new();
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [1.0f32, 2.0, 3.0, 5.0];
        let key = |v: &[f32]| TensorKey::of(DType::F32, &[1, 4], bytemuck::cast_slice(v));
        let make = |v: &'static [f32; 4]| {
            let backend = &*backend;
            move || Ok::<_, ()>(matrix(backend, v))
        };
        static A: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
        static B: [f32; 4] = [1.0, 2.0, 3.0, 5.0];
        let (first, reused_first) = store.matrix(key(&a), 16, make(&A)).unwrap();
        let (second, reused_second) = store.matrix(key(&a), 16, make(&A)).unwrap();
        let (other, reused_other) = store.matrix(key(&b), 16, make(&B)).unwrap();
        assert!(!reused_first && reused_second && !reused_other);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(
            store.stats(),
            StoreStats {
                resident_bytes: 32,
                tensors: 2
            }
        );
        drop(first);
        assert_eq!(store.stats().resident_bytes, 32, "still used by `second`");
        drop(second);
        drop(other);
        assert_eq!(store.stats(), StoreStats::default());
        // A freed tensor is built again, not resurrected.
        let (again, reused) = store.matrix(key(&a), 16, make(&A)).unwrap();
        assert!(!reused);
        assert_eq!(again.bytes(), 16);
    }

    on_each_device!(
        identical_tensors_are_stored_once_and_freed_with_their_last_user,
        threads = 1
    );

    #[test]
    fn the_same_bytes_with_another_shape_are_another_tensor() {
        let data = [0u8; 16];
        assert_ne!(
            TensorKey::of(DType::F32, &[1, 4], &data),
            TensorKey::of(DType::F32, &[2, 2], &data)
        );
        assert_ne!(
            TensorKey::of(DType::F32, &[4], &data),
            TensorKey::of(DType::F16, &[4], &data)
        );
    }
}
