//! An adapter in a backend's memory, ready for a step: each update's `A`
//! and `Bᵀ` as backend matrices in BF16 (see `switchyard_kernels::LoraRows`).
//!
//! BF16, not the f32 the loader gives: a step reads every adapter of its
//! rows whole (sixteen decode rows on sixteen adapters read sixteen
//! adapters), so the bytes per value set the cost of a mixed batch, and
//! BF16 halves them. The kernel widens each value to f32 and keeps the
//! arithmetic f32, so the only change is the rounding of `A` and `B` to
//! eight significant bits (relative 2⁻⁹), as adapters are trained and
//! shipped in BF16 anyway; an update is a small correction to the base's
//! product, so its logits move by far less than the base's own rounding
//! (tests/python/test_lora.py compares them with the NumPy reference).
//! Q8_0 (opt-in, [`DTYPE_ENV_VAR`]) halves the bytes again but is not the
//! default: its widening costs more than the bytes it saves and its logits
//! sit further from the F32 adapter's (docs/bench/lora.md, Q8_0 adapters
//! interleaved).

use bytes::Bytes;
use switchyard_kernels::{Backend, DType, KernelError, LoraSide, WeightView};

use super::target::Target;
use super::weights::AdapterWeights;

/// The environment variable that keeps `A` and `Bᵀ` in F32 instead (`1`):
/// a precision check, or the F32 side of an A/B measurement
/// (`benches/lora_serving.py --f32`).
pub const F32_ENV_VAR: &str = "SWITCHYARD_LORA_F32";

/// The environment variable that names the type `A` and `Bᵀ` are kept in:
/// `f32`, `bf16` or `q8_0`.
pub const DTYPE_ENV_VAR: &str = "SWITCHYARD_LORA_DTYPE";

/// The type `A` and `Bᵀ` are kept in: BF16 unless [`F32_ENV_VAR`] is `1`
/// or [`DTYPE_ENV_VAR`] names another.
pub fn resident_dtype() -> DType {
    if std::env::var(F32_ENV_VAR).is_ok_and(|v| v == "1") {
        return DType::F32;
    }
    match std::env::var(DTYPE_ENV_VAR).as_deref() {
        Ok("f32") => DType::F32,
        Ok("q8_0") => DType::Q8_0,
        _ => DType::BF16,
    }
}

/// One weight's update in the backend.
pub struct ResidentWeight<B: Backend> {
    /// `rank × in`, [`resident_dtype`].
    pub a: B::Matrix,
    /// `rank × out`, [`resident_dtype`].
    pub b_t: B::Matrix,
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
    /// Copies `weights` into `backend`, in [`resident_dtype`].
    pub fn upload(backend: &B, weights: &AdapterWeights) -> Result<Self, KernelError> {
        let mut layers = Vec::with_capacity(weights.layers.len());
        let mut bytes = 0u64;
        let dtype = resident_dtype();
        for targets in &weights.layers {
            let mut resident: [Option<ResidentWeight<B>>; 7] = Default::default();
            for (slot, w) in resident.iter_mut().zip(targets) {
                if let Some(w) = w {
                    let a = view(dtype, &w.a, w.rank)?;
                    let b_t = view(dtype, &w.b_t, w.rank)?;
                    bytes += (a.data.len() + b_t.data.len()) as u64;
                    *slot = Some(ResidentWeight {
                        a: backend.lora_matrix(a, LoraSide::Shrink)?,
                        b_t: backend.lora_matrix(b_t, LoraSide::Expand)?,
                        rank: w.rank,
                        scale: w.scale,
                    });
                }
            }
            layers.push(resident);
        }
        Ok(ResidentAdapter {
            identity: weights.identity,
            bytes,
            layers,
        })
    }

    /// The hash of its values (see `AdapterWeights::identity`): the
    /// prompt cache's `CacheKey::adapter`.
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// Bytes it holds in the backend (what the adapter budget counts).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The update of `target` in layer `layer`, if the adapter has one.
    pub fn weight(&self, layer: usize, target: Target) -> Option<&ResidentWeight<B>> {
        self.layers.get(layer)?.get(target.index())?.as_ref()
    }
}

/// `values` (`rank` rows) as a matrix of `dtype` (F32 as they are; BF16
/// each rounded to the nearest, ties to even; Q8_0 by blocks of 32 along
/// each row, or BF16 where a row is not whole blocks).
fn view(dtype: DType, values: &[f32], rank: usize) -> Result<WeightView, KernelError> {
    let cols = values.len().checked_div(rank).unwrap_or(0);
    let bytes: Vec<u8> = match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::Q8_0 if cols.is_multiple_of(32) => {
            let bytes = switchyard_kernels::formats::quantize::quantize(dtype, values)?;
            return WeightView::new(dtype, rank, cols, Bytes::from(bytes));
        }
        _ => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
    };
    let dtype = if dtype == DType::F32 {
        DType::F32
    } else {
        DType::BF16
    };
    WeightView::new(dtype, rank, cols, Bytes::from(bytes))
}
