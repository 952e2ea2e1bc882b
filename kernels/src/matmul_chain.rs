//! A chain of [`Backend::matmul_many`] stages over one set of buffers
//! ([`Backend::matmul_chain`]), where a stage's input may be what an
//! earlier stage wrote: a layer's O product with its residual add, the
//! MLP's norm, gate/up, and the gating with down and its residual add.
//!
//! The stages name their buffers by [`Slot`] (an index into the call's
//! buffers) because one buffer is written by one stage and read by the
//! next, which borrows cannot say in one list. Each stage is exactly one
//! `matmul_many` call: a backend that fuses the chain into one parallel
//! job must give the bits [`matmul_stages_one_by_one`] gives.

use crate::{Backend, KernelError, MatmulInput, MatmulProduct};

/// A buffer of a [`Backend::matmul_chain`] call: its index in the call's
/// `buffers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(pub usize);

/// One stage of a chain: `input`'s step, then `products` on its rows, as
/// one [`Backend::matmul_many`] would run them.
pub struct MatmulStage<'a, B: Backend> {
    pub input: MatmulInput<'a, B, Slot, Slot>,
    pub products: &'a [MatmulProduct<'a, B, Slot>],
}

/// The stages one [`Backend::matmul_many`] call after another: the default
/// [`Backend::matmul_chain`], and the CPU backend's for what it does not
/// fuse.
pub fn matmul_stages_one_by_one<B: Backend>(
    backend: &B,
    buffers: &mut [&mut B::Activations],
    stages: &[MatmulStage<'_, B>],
) -> Result<(), KernelError> {
    for stage in stages {
        let (input, mut products) = borrow_stage(buffers, stage)?;
        backend.matmul_many(input, &mut products)?;
    }
    Ok(())
}

/// `stage` over borrows of `buffers`: the `matmul_many` call it stands
/// for. Fails when a slot is past the buffers or named twice in the stage
/// (a product cannot write its own input, nor two products one output).
pub fn borrow_stage<'b, B: Backend>(
    buffers: &'b mut [&mut B::Activations],
    stage: &MatmulStage<'b, B>,
) -> Result<(MatmulInput<'b, B>, Vec<MatmulProduct<'b, B>>), KernelError> {
    let mut free: Vec<Option<&'b mut B::Activations>> =
        buffers.iter_mut().map(|b| Some(&mut **b)).collect();
    let count = free.len();
    let mut take = |slot: Slot| {
        free.get_mut(slot.0)
            .and_then(Option::take)
            .ok_or_else(|| KernelError::Shape {
                op: "matmul_chain",
                detail: format!(
                    "buffer {} of {count} is missing or named twice in one stage",
                    slot.0
                ),
            })
    };
    let input = match stage.input {
        MatmulInput::Rows(x) => MatmulInput::Rows(&*take(x)?),
        MatmulInput::RmsNorm {
            x,
            weight,
            eps,
            out,
        } => MatmulInput::RmsNorm {
            x: &*take(x)?,
            weight,
            eps,
            out: take(out)?,
        },
        MatmulInput::SiluMul { gate, up } => MatmulInput::SiluMul {
            gate: take(gate)?,
            up: &*take(up)?,
        },
        MatmulInput::GeluMul { gate, up } => MatmulInput::GeluMul {
            gate: take(gate)?,
            up: &*take(up)?,
        },
    };
    let products = stage
        .products
        .iter()
        .map(|p| {
            Ok(MatmulProduct {
                w: p.w,
                bias: p.bias,
                out: take(p.out)?,
                accumulate: p.accumulate,
            })
        })
        .collect::<Result<Vec<_>, KernelError>>()?;
    Ok((input, products))
}
