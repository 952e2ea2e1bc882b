//! The twin of `device.rs` in a build without the `cuda` feature: the same
//! names, and every open fails with [`CudaError::NotCompiled`].

use super::CudaError;

/// A GPU; never exists in a build without CUDA.
pub enum CudaDevice {}

impl CudaDevice {
    pub fn describe(&self) -> String {
        match *self {}
    }
}

/// Opens GPU `ordinal`: always [`CudaError::NotCompiled`] here.
pub fn open(_ordinal: usize) -> Result<CudaDevice, CudaError> {
    Err(CudaError::NotCompiled)
}

#[cfg(test)]
mod tests {
    #[test]
    fn opening_says_cuda_is_not_compiled_in() {
        let err = super::open(0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--features cuda"), "{err}");
        assert!(!err.contains('\n'));
    }
}
