//! The shape and hyper-parameters of a Llama-family model, whatever file it came from.

use switchyard_kernels::RopeStyle;

/// Supported architectures. All are the Llama block (RMSNorm, rotary
/// attention with grouped-query heads, a gated MLP); they differ in the
/// details recorded in [`ModelConfig`] and its [`FamilyTraits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama.
    Llama,
    /// Mistral: the Llama block, with a sliding window where the
    /// checkpoint gives one.
    Mistral,
    /// Qwen2: bias on the Q, K and V projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on queries and keys, no Q/K/V bias.
    Qwen3,
    /// Gemma 2: embeddings scaled by √d, norms before and after attention
    /// and MLP, GeGLU, local (sliding-window) and global layers
    /// alternating, attention and final logits soft-capped.
    Gemma2,
    /// Gemma 3 (text): Gemma 2's block with query/key norms instead of
    /// attention soft-capping, five local layers per global one, and a
    /// RoPE base of their own for local layers.
    Gemma3,
    /// Phi-3: fused QKV and gate/up projections (split at load).
    Phi3,
}

/// Every architecture, for listings and error messages.
pub const ARCHITECTURES: [Architecture; 7] = [
    Architecture::Llama,
    Architecture::Mistral,
    Architecture::Qwen2,
    Architecture::Qwen3,
    Architecture::Gemma2,
    Architecture::Gemma3,
    Architecture::Phi3,
];

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
        }
    }

    /// The architecture named `name` in GGUF's `general.architecture` or a
    /// Hugging Face `model_type` (`gemma3_text` for Gemma 3's text model).
    pub fn from_name(name: &str) -> Option<Self> {
        if name == "gemma3_text" {
            return Some(Architecture::Gemma3);
        }
        ARCHITECTURES.into_iter().find(|a| a.name() == name)
    }

    /// The names [`Architecture::from_name`] accepts, comma-separated.
    pub fn supported_list() -> String {
        ARCHITECTURES.map(|a| a.name()).join(", ")
    }

    /// Gemma 2 or 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }
}

/// The MLP's gate nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// What sets a family's block apart from Llama's. [`Default`] is Llama's.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyTraits {
    pub activation: Activation,
    /// Embeddings are multiplied by this (Gemma: √hidden_size).
    pub embed_scale: Option<f32>,
    /// RMSNorm after attention and after the MLP, before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Per-head RMSNorm on queries and keys (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Attention scores are scaled by this instead of `1/√head_dim`
    /// (Gemma's `query_pre_attn_scalar^-½`).
    pub attn_scale: Option<f32>,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Sliding-window attention: positions a local layer's row sees,
    /// itself included.
    pub sliding_window: Option<usize>,
    /// Which layers are local when there is a window: with `n > 0`, layer
    /// `i` is local unless `i % n == n - 1` (Gemma 2: 2, Gemma 3: 6);
    /// with 0 every layer is (Mistral).
    pub swa_pattern: usize,
    /// RoPE base of local layers when it differs from `rope_theta` (Gemma
    /// 3's `rope_local_base_freq`); local layers take no RoPE scaling then.
    pub rope_local_theta: Option<f32>,
    /// Added to every RMSNorm weight at load: Hugging Face Gemma weights
    /// store `w` and scale by `1 + w`; GGUF converters store `1 + w`.
    pub norm_offset: f32,
}

impl Default for FamilyTraits {
    fn default() -> Self {
        FamilyTraits {
            activation: Activation::Silu,
            embed_scale: None,
            post_norms: false,
            qk_norm: false,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            swa_pattern: 0,
            rope_local_theta: None,
            norm_offset: 0.0,
        }
    }
}

impl FamilyTraits {
    /// Layer `layer`'s sliding window, if it is a local layer.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let window = self.sliding_window?;
        let n = self.swa_pattern;
        (n == 0 || layer % n != n - 1).then_some(window)
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
    /// What the family changes in the block.
    pub traits: FamilyTraits,
}

impl ModelConfig {
    /// Inverse rotary frequencies per dimension pair, scaling applied.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        inv_freq(self.rope_theta, self.head_dim, self.rope_scaling)
    }

    /// Local layers' inverse frequencies when their RoPE base differs.
    pub fn rope_local_inv_freq(&self) -> Option<Vec<f32>> {
        let theta = self.traits.rope_local_theta?;
        Some(inv_freq(theta, self.head_dim, RopeScaling::None))
    }

    /// The attention score scale.
    pub fn attention_scale(&self) -> f32 {
        self.traits
            .attn_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Per layer, its sliding window if it is a local layer.
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        (0..self.n_layers).map(|l| self.traits.window(l)).collect()
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
        let t = &self.traits;
        let positive_or_none = [
            ("attn_scale", t.attn_scale),
            ("attn_softcap", t.attn_softcap),
            ("final_softcap", t.final_softcap),
            ("embed_scale", t.embed_scale),
            ("rope_local_theta", t.rope_local_theta),
        ];
        for (name, value) in positive_or_none {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(format!("{name} ({v}) must be a positive number"));
            }
        }
        if t.sliding_window == Some(0) {
            return Err("sliding_window is 0".into());
        }
        Ok(())
    }
}

fn inv_freq(theta: f32, head_dim: usize, scaling: RopeScaling) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let base = 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64);
            scale_frequency(base, scaling) as f32
        })
        .collect()
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
