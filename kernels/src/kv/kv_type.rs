//! How keys and values are stored: the element format of a KV block,
//! the same on every device.

use crate::KernelError;

/// How keys and values are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// Four bytes an element: exact.
    F32,
    /// Two bytes an element, rounded to nearest even on write (as
    /// llama.cpp's default `-ctk f16 -ctv f16`).
    #[default]
    F16,
    /// 34 bytes per 32 elements, as llama.cpp's `-ctk q8_0 -ctv q8_0`: each
    /// position's key and value of a KV head in groups of 32 dimensions,
    /// int8 with an f16 scale per group (the CPU's `kv_q8` has the
    /// rounding). Needs a head_dim that is a multiple of 32.
    Q8_0,
}

/// Dimensions of one Q8_0 group, and its bytes: 32 int8 and an f16 scale.
pub(crate) const Q8_GROUP: usize = 32;
pub(crate) const Q8_GROUP_BYTES: usize = Q8_GROUP + 2;

impl KvType {
    /// Bytes of `elements` keys or values stored one after another (for
    /// Q8_0, whole groups of 32: a partial group still takes a group's
    /// 34 bytes); `None` on overflow.
    pub fn bytes_of(self, elements: usize) -> Option<usize> {
        match self {
            KvType::F32 => elements.checked_mul(4),
            KvType::F16 => elements.checked_mul(2),
            KvType::Q8_0 => elements.div_ceil(Q8_GROUP).checked_mul(Q8_GROUP_BYTES),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Refuses a head_dim the type cannot store: Q8_0 quantizes whole
    /// groups of 32 dimensions of one head.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KernelError> {
        if self == KvType::Q8_0 && !head_dim.is_multiple_of(Q8_GROUP) {
            return Err(KernelError::Shape {
                op: "kv_cache",
                detail: format!(
                    "a q8_0 KV cache stores groups of {Q8_GROUP} dimensions of a head, but \
                     this model's head_dim is {head_dim}; use --kv-type f16 or f32"
                ),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!("unknown KV type {other:?}; use f16, f32 or q8_0")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_types_parse() {
        assert_eq!("F16".parse::<KvType>(), Ok(KvType::F16));
        assert_eq!("f32".parse::<KvType>(), Ok(KvType::F32));
        assert_eq!("Q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4".parse::<KvType>().is_err());
        for t in [KvType::F32, KvType::F16, KvType::Q8_0] {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
    }

    #[test]
    fn bytes_are_exact_per_type() {
        // One block of SmolLM2's 3 KV heads of 64: 32 keys and 32 values.
        let elements = 3 * 64 * 2 * 32;
        assert_eq!(KvType::F32.bytes_of(elements), Some(4 * elements));
        assert_eq!(KvType::F16.bytes_of(elements), Some(2 * elements));
        assert_eq!(KvType::Q8_0.bytes_of(elements), Some(elements / 32 * 34));
        assert_eq!(KvType::Q8_0.bytes_of(usize::MAX), None);
    }

    #[test]
    fn q8_0_refuses_a_head_dim_off_its_groups() {
        assert!(KvType::Q8_0.check_head_dim(64).is_ok());
        assert!(KvType::F16.check_head_dim(80).is_ok());
        let err = KvType::Q8_0.check_head_dim(80).unwrap_err().to_string();
        assert!(err.contains("head_dim is 80"), "{err}");
    }
}
