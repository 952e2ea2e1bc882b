//! A layer's tail after attention as one [`Backend::matmul_chain`]: the O
//! product with its residual add, the MLP's norm with gate/up, and the
//! gating with down and its residual add. Three `matmul_many` calls one
//! after another, stated once so that a backend can run them as one
//! parallel job (the CPU does: two fewer pool jobs a layer at decode).
//!
//! Only for what the three calls cover alone: every part sharing the
//! tensors, no adapter, no post norms (the step's other path runs those).

use switchyard_kernels::{Backend, KernelError, MatmulInput, MatmulProduct, MatmulStage, Slot};

use super::config::Activation;
use super::llama::Scratch;

/// The tensors of one layer's tail, shared by every part of the step.
pub(super) struct LayerTail<'a, B: Backend> {
    pub(super) wo: &'a B::Matrix,
    pub(super) ffn_norm: &'a B::Vector,
    pub(super) eps: f32,
    pub(super) gate: &'a B::Matrix,
    pub(super) up: &'a B::Matrix,
    pub(super) down: &'a B::Matrix,
    pub(super) activation: Activation,
}

// The chain's buffers, in the order `run` lends them.
const ATTN: Slot = Slot(0);
const X: Slot = Slot(1);
const NORMED: Slot = Slot(2);
const GATE: Slot = Slot(3);
const UP: Slot = Slot(4);

/// `x += attn · Woᵀ`; `normed = rms_norm(x)`, `gate`, `up` from it;
/// `x += act(gate) · up · Wdᵀ` (the gating in place in `gate`, as the
/// step's other path leaves it).
pub(super) fn run<B: Backend>(
    backend: &B,
    t: &LayerTail<'_, B>,
    s: &mut Scratch<B>,
) -> Result<(), KernelError> {
    let product = |w, out, accumulate| MatmulProduct {
        w,
        bias: None,
        out,
        accumulate,
    };
    let o = [product(t.wo, X, true)];
    let gate_up = [product(t.gate, GATE, false), product(t.up, UP, false)];
    let down = [product(t.down, X, true)];
    let gating = match t.activation {
        Activation::Silu => MatmulInput::SiluMul { gate: GATE, up: UP },
        Activation::GeluTanh => MatmulInput::GeluMul { gate: GATE, up: UP },
    };
    let stages = [
        MatmulStage {
            input: MatmulInput::Rows(ATTN),
            products: &o,
        },
        MatmulStage {
            input: MatmulInput::RmsNorm {
                x: X,
                weight: t.ffn_norm,
                eps: t.eps,
                out: NORMED,
            },
            products: &gate_up,
        },
        MatmulStage {
            input: gating,
            products: &down,
        },
    ];
    let mut buffers = [&mut s.attn, &mut s.x, &mut s.normed, &mut s.gate, &mut s.up];
    backend.matmul_chain(&mut buffers, &stages)
}
