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
}

impl AttentionPrecision {
    pub fn name(self) -> &'static str {
        match self {
            AttentionPrecision::F32 => "f32",
            AttentionPrecision::Bf16 => "bf16",
            AttentionPrecision::Bf16Prompt => "bf16-prompt",
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
            _ => Err(format!(
                "unknown attention precision {s:?}; known: f32, bf16, bf16-prompt"
            )),
        }
    }
}
