//! Tensor element types as they are stored in checkpoints.
//!
//! The quantized layouts are ggml's (the GGUF file format's): a row of `n`
//! elements is `n / block_len` blocks of `block_bytes` bytes each.

/// A tensor's storage type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// 32 elements: f16 scale, 32 × i8.
    Q8_0,
    /// 32 elements: f16 scale, 16 bytes of 4-bit values (offset 8).
    Q4_0,
    /// 32 elements: f16 scale, f16 min, 16 bytes of 4-bit values.
    Q4_1,
    /// 256 elements: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit values.
    Q4K,
    /// 256 elements: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 × i8 scales, f16 d.
    Q6K,
    /// 32 elements: f16 scale, 32 high bits (u32), 16 bytes of low 4 bits (offset 16).
    Q5_0,
    /// 32 elements: f16 scale, f16 min, 32 high bits (u32), 16 bytes of low 4 bits.
    Q5_1,
    /// 256 elements: 16 bytes of 4-bit scales and mins, 64 bytes of 2-bit quants, f16 d, f16 dmin.
    Q2K,
    /// 256 elements: 32 bytes of high bits, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales, f16 d.
    Q3K,
    /// 256 elements: f16 d, f16 dmin, 12 bytes of scales/mins, 32 bytes of fifth bits, 128 bytes of nibbles.
    Q5K,
    /// 32 elements: f16 scale, 16 bytes of 4-bit indices into a fixed non-linear table.
    IQ4NL,
    /// 256 elements: f16 d, 6-bit scales per 32 (u16 high bits, 4 bytes low nibbles), 128 bytes of indices.
    IQ4XS,
}

impl DType {
    /// Every supported type, for tests and tables.
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q5K,
        DType::IQ4NL,
        DType::IQ4XS,
    ];

    /// Elements per block.
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL => {
                32
            }
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K | DType::IQ4XS => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q4K => 144,
            DType::Q6K => 210,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q5K => 176,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
        }
    }

    /// Bytes taken by `elements` consecutive elements, or `None` when
    /// `elements` is not a whole number of blocks.
    pub fn bytes_for(self, elements: usize) -> Option<usize> {
        if !elements.is_multiple_of(self.block_len()) {
            return None;
        }
        (elements / self.block_len()).checked_mul(self.block_bytes())
    }

    /// The ggml type id used in GGUF files.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q5K => 13,
            DType::IQ4NL => 20,
            DType::IQ4XS => 23,
            DType::Q4K => 12,
            DType::Q6K => 14,
            DType::BF16 => 30,
        }
    }

    /// The type for a ggml type id, or `None` when Switchyard does not support it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Lower-case name as used on the command line and in errors (`q4_k`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q5K => "q5_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
        }
    }

    /// Parses [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether the type is a block-quantized integer format.
    pub const fn is_quantized(self) -> bool {
        !matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        assert_eq!(DType::from_ggml_id(6), Some(DType::Q5_0));
        assert_eq!(DType::from_ggml_id(16), None, "IQ2_XXS is not supported");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(DType::Q4_1.bytes_for(576), Some(18 * 20));
        assert_eq!(DType::Q4K.bytes_for(576), None);
        assert_eq!(DType::Q6K.bytes_for(512), Some(420));
        assert_eq!(DType::BF16.bytes_for(3), Some(6));
        assert_eq!(DType::Q5_0.bytes_for(64), Some(44));
    }
}
