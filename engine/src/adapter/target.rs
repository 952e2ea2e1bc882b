//! The seven weights of a Llama block an adapter can change, under the
//! names PEFT and GGUF give them.

use crate::model::config::ModelConfig;

/// A linear layer of a block that takes a low-rank update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

/// Every target, in the order a step applies them.
pub const TARGETS: [Target; 7] = [
    Target::Q,
    Target::K,
    Target::V,
    Target::O,
    Target::Gate,
    Target::Up,
    Target::Down,
];

impl Target {
    /// The module's name in a PEFT file (`q_proj`).
    pub fn peft(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The weight's name in a GGUF file (`attn_q`).
    pub fn gguf(self) -> &'static str {
        match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up => "ffn_up",
            Target::Down => "ffn_down",
        }
    }

    pub fn from_peft(name: &str) -> Option<Target> {
        TARGETS.into_iter().find(|t| t.peft() == name)
    }

    pub fn from_gguf(name: &str) -> Option<Target> {
        TARGETS.into_iter().find(|t| t.gguf() == name)
    }

    /// Position in [`TARGETS`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `(in, out)`: the widths of the weight's input and output rows.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let q = c.n_heads * c.head_dim;
        let kv = c.n_kv_heads * c.head_dim;
        let (h, f) = (c.hidden_size, c.intermediate_size);
        match self {
            Target::Q => (h, q),
            Target::K | Target::V => (h, kv),
            Target::O => (q, h),
            Target::Gate | Target::Up => (h, f),
            Target::Down => (f, h),
        }
    }
}
