//! An adapter in a backend's memory, ready for a step: each update's `A`
//! and `Bᵀ` as backend vectors (see `switchyard_kernels::LoraRows`).

use switchyard_kernels::{Backend, KernelError};

use super::target::Target;
use super::weights::AdapterWeights;

/// One weight's update in the backend.
pub struct ResidentWeight<B: Backend> {
    pub a: B::Vector,
    pub b_t: B::Vector,
    pub rank: usize,
    pub scale: f32,
}

/// An adapter resident in a backend.
pub struct ResidentAdapter<B: Backend> {
    identity: u64,
    bytes: u64,
    layers: Vec<[Option<ResidentWeight<B>>; 7]>,
}

impl<B: Backend> ResidentAdapter<B> {
    /// Copies `weights` into `backend`.
    pub fn upload(backend: &B, weights: &AdapterWeights) -> Result<Self, KernelError> {
        let mut layers = Vec::with_capacity(weights.layers.len());
        for targets in &weights.layers {
            let mut resident: [Option<ResidentWeight<B>>; 7] = Default::default();
            for (slot, w) in resident.iter_mut().zip(targets) {
                if let Some(w) = w {
                    *slot = Some(ResidentWeight {
                        a: backend.vector(&w.a)?,
                        b_t: backend.vector(&w.b_t)?,
                        rank: w.rank,
                        scale: w.scale,
                    });
                }
            }
            layers.push(resident);
        }
        Ok(ResidentAdapter {
            identity: weights.identity,
            bytes: weights.bytes(),
            layers,
        })
    }

    /// The hash of its values (see `AdapterWeights::identity`): the
    /// prompt cache's `CacheKey::adapter`.
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// Bytes it holds in the backend.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The update of `target` in layer `layer`, if the adapter has one.
    pub fn weight(&self, layer: usize, target: Target) -> Option<&ResidentWeight<B>> {
        self.layers.get(layer)?.get(target.index())?.as_ref()
    }
}
