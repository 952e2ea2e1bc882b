//! How attention multiplies: the choice `--attention-precision` names.

/// The arithmetic of attention's two products (queries·keys and
/// probabilities·values). Softmax, its sums and the accumulation are f32
/// either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionPrecision {
    /// f32 inputs and products (fused multiply-adds).
    #[default]
    F32,
    /// Inputs rounded to BF16, products accumulated in f32, as GPU flash
    /// attention does: twice the multiply-adds an instruction on CPUs
    /// with AVX-512 BF16 (`vdpbf16ps`), the same results bit for bit from
    /// a scalar path elsewhere (slower than f32 there). The rounding is
    /// written out in `kernels/src/cpu/attention/bf16.rs`.
    Bf16,
    /// [`AttentionPrecision::Bf16`] on AMX tiles for the rows of a prompt
    /// (any chunk of it: `AttentionRows::prompt`) on CPUs with AMX-BF16,
    /// f32 for decode and speculative-verify rows and for every row on
    /// other CPUs: prompts at AMX's speed, decode at f32's, and a prompt
    /// row's result independent of its chunk (a prompt-cache hit exact).
    Bf16Prompt,
    /// The rows of [`AttentionPrecision::Bf16Prompt`] (a prompt's, on
    /// AMX-BF16 CPUs), each operand split in two BF16 parts and a product
    /// summed from three (`hi·hi + hi·lo + lo·hi`, f32 accumulation): about
    /// 16 bits of each query and probability, all 11 of an F16 key or
    /// value, so close to f32's results at about three times
    /// `bf16-prompt`'s AMX work. f32 elsewhere, as `bf16-prompt`. Written
    /// out in `kernels/src/cpu/attention/bf16x3.rs`.
    Bf16x3,
}

impl AttentionPrecision {
    pub fn name(self) -> &'static str {
        match self {
            AttentionPrecision::F32 => "f32",
            AttentionPrecision::Bf16 => "bf16",
            AttentionPrecision::Bf16Prompt => "bf16-prompt",
            AttentionPrecision::Bf16x3 => "bf16x3",
        }
    }
}

impl std::fmt::Display for AttentionPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AttentionPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(AttentionPrecision::F32),
            "bf16" => Ok(AttentionPrecision::Bf16),
            "bf16-prompt" => Ok(AttentionPrecision::Bf16Prompt),
            "bf16x3" => Ok(AttentionPrecision::Bf16x3),
            _ => Err(format!(
                "unknown attention precision {s:?}; known: f32, bf16, bf16-prompt, bf16x3"
            )),
        }
    }
}
