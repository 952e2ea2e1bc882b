//! The shape and hyper-parameters of a Llama-family model, whatever file it came from.

use switchyard_kernels::RopeStyle;

/// Supported architectures. All are the Llama block (RMSNorm, rotary
/// attention with grouped-query heads, SiLU-gated MLP); they differ in the
/// details recorded in [`ModelConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama.
    Llama,
    /// Mistral: the Llama block; sliding-window attention is not applied
    /// (identical for sequences shorter than the window).
    Mistral,
    /// Qwen2: bias on the Q, K and V projections.
    Qwen2,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Architecture::Llama),
            "mistral" => Some(Architecture::Mistral),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }
}

/// How rotary frequencies are stretched for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (all frequencies divided by `factor`).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context_length: usize,
    },
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The context window the model was trained for.
    pub context_length: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    /// The output projection reuses the token embedding table.
    pub tied_embeddings: bool,
    /// Q, K and V projections carry a bias (Qwen2).
    pub qkv_bias: bool,
}

impl ModelConfig {
    /// Inverse rotary frequencies per dimension pair, scaling applied.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let base =
                    1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / self.head_dim as f64);
                scale_frequency(base, self.rope_scaling) as f32
            })
            .collect()
    }

    /// Checks the numbers are consistent with each other; `Err` says which.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("context_length", self.context_length),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} is 0"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "n_heads ({}) is not a multiple of n_kv_heads ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) is odd; rotary embedding needs pairs",
                self.head_dim
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "rms_norm_eps ({}) must be a positive number",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!(
                "rope_theta ({}) must be a positive number",
                self.rope_theta
            ));
        }
        Ok(())
    }
}

fn scale_frequency(freq: f64, scaling: RopeScaling) -> f64 {
    match scaling {
        RopeScaling::None => freq,
        RopeScaling::Linear { factor } => freq / factor as f64,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        } => {
            let (factor, low, high) = (
                factor as f64,
                low_freq_factor as f64,
                high_freq_factor as f64,
            );
            let old_len = original_context_length as f64;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let low_freq_wavelen = old_len / low;
            let high_freq_wavelen = old_len / high;
            if wavelen < high_freq_wavelen {
                freq
            } else if wavelen > low_freq_wavelen {
                freq / factor
            } else {
                let smooth = (old_len / wavelen - low) / (high - low);
                (1.0 - smooth) * freq / factor + smooth * freq
            }
        }
    }
}
