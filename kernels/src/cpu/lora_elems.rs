//! How the elements of an adapter's rows are stored, for the LoRA shrink
//! (`lora_shrink`) and expand (`lora_expand`) kernels and their SIMD
//! children alike (its own module so that none of them reaches a parent).

use crate::DType;

/// How the elements of a row are stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Elems {
    F32,
    Bf16,
    /// Blocks of 32: an f16 `d`, then 32 × i8 `q`; the value is `q · d`.
    Q8,
}

impl Elems {
    pub(crate) fn of(dtype: DType) -> Option<Elems> {
        match dtype {
            DType::F32 => Some(Elems::F32),
            DType::BF16 => Some(Elems::Bf16),
            DType::Q8_0 => Some(Elems::Q8),
            _ => None,
        }
    }
}
