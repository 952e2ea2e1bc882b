//! Names of ggml tensor type ids, so that an unsupported type can be named
//! in an error instead of shown as a bare number.

/// The ggml name of a tensor type id (`Q5_0`, `IQ2_XXS`, ...), or `unknown`.
pub fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2 (removed)",
        "Q4_3 (removed)",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4 (removed)",
        "Q4_0_4_8 (removed)",
        "Q4_0_8_8 (removed)",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4 (removed)",
        "IQ4_NL_4_8 (removed)",
        "IQ4_NL_8_8 (removed)",
        "MXFP4",
    ];
    usize::try_from(id)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_ggml_ids() {
        assert_eq!(ggml_type_name(0), "F32");
        assert_eq!(ggml_type_name(6), "Q5_0");
        assert_eq!(ggml_type_name(14), "Q6_K");
        assert_eq!(ggml_type_name(30), "BF16");
        assert_eq!(ggml_type_name(39), "MXFP4");
        assert_eq!(ggml_type_name(4000), "unknown");
    }
}
