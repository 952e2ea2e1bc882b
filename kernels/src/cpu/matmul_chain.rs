//! [`crate::Backend::matmul_chain`] on the CPU: every stage in one pool
//! job, each stage's rows made behind a barrier inside the job
//! (`matmul::run_stages`) instead of behind a new dispatch.
//!
//! At single-stream decode a pool job is 14 µs on SmolLM2 and each
//! boundary between jobs costs the worker about 2.5 µs (the caller's
//! serial code between them, the dispatch and the join,
//! docs/bench/roofline.md): a layer's O product, gate/up and down as one
//! job save two of the layer's five. A stage runs the same row steps,
//! quantization and product tasks as its `matmul_many` call would, so the
//! chain gives the same bits as the calls one by one.

use super::cpu_backend::CpuBackend;
use super::disjoint::DisjointSlice;
use super::isa::CheckedIsa;
use super::matmul::{self, run_stages, Stage, Target};
use super::matmul_input::{Input, RowSteps, Step};
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::matmul_chain::borrow_stage;
use crate::{KernelError, MatmulInput, MatmulStage, Slot};

/// Whether the chain runs as one job: every weight quantized (float
/// weights read f32 rows, which their own jobs make) and more than one
/// stage.
pub(crate) fn fuses(stages: &[MatmulStage<'_, CpuBackend>]) -> bool {
    stages.len() > 1
        && stages
            .iter()
            .flat_map(|s| s.products)
            .all(|p| p.w.dtype().is_quantized())
}

/// The chain (see [`fuses`]) as one job, after every stage is checked as
/// its `matmul_many` call would check it.
pub(crate) fn matmul_chain(
    pool: &ThreadPool,
    isa: CheckedIsa,
    buffers: &mut [&mut CpuActivations],
    stages: &[MatmulStage<'_, CpuBackend>],
) -> Result<(), KernelError> {
    for stage in stages {
        let (input, mut products) = borrow_stage(buffers, stage)?;
        matmul::check(&Input::from(input), &matmul::products(&mut products))?;
    }
    let views: Vec<View> = buffers
        .iter_mut()
        .map(|b| View {
            ptr: b.data.as_mut_ptr(),
            len: b.data.len(),
            rows: b.rows,
            cols: b.cols,
        })
        .collect();
    let jobs = stages
        .iter()
        .map(|s| stage(pool, isa, &views, s))
        .collect::<Result<Vec<_>, KernelError>>()?;
    run_stages(pool, isa, &jobs);
    Ok(())
}

/// A buffer of the chain as raw parts: every stage that reads or writes
/// it takes a [`DisjointSlice`] of them, and the job's barriers order
/// those accesses (a stage writes a buffer only after the stages before
/// it, which read or wrote it, have finished).
struct View {
    ptr: *mut f32,
    len: usize,
    rows: usize,
    cols: usize,
}

impl View {
    /// A view of the buffer's data for one stage.
    ///
    /// # Safety
    /// The buffer stays borrowed by the chain while the view lives, and
    /// no two tasks touch one element at once except to read it.
    unsafe fn slice<'a>(&self) -> DisjointSlice<'a, f32> {
        // SAFETY: the caller's promise.
        unsafe { DisjointSlice::from_raw(self.ptr, self.len) }
    }
}

/// `stage` as the job's tasks see it, over `views`.
fn stage<'a>(
    pool: &ThreadPool,
    isa: CheckedIsa,
    views: &'a [View],
    stage: &'a MatmulStage<'a, CpuBackend>,
) -> Result<Stage<'a>, KernelError> {
    let view = |slot: Slot| {
        views.get(slot.0).ok_or_else(|| KernelError::Shape {
            op: "matmul_chain",
            detail: format!("buffer {} of {}", slot.0, views.len()),
        })
    };
    // SAFETY (every `slice`): `views` borrow the chain's buffers for its
    // call; within a stage each row is one row task's, each output column
    // one product task's, and the barriers between stages order the rest.
    let (step, rows) = unsafe {
        match stage.input {
            MatmulInput::Rows(x) => (Step::Rows(view(x)?.slice()), view(x)?),
            MatmulInput::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => (
                Step::RmsNorm {
                    x: view(x)?.slice(),
                    weight: &weight.values,
                    eps,
                    out: view(out)?.slice(),
                },
                view(x)?,
            ),
            MatmulInput::SiluMul { gate, up } => (
                Step::SiluMul {
                    up: view(up)?.slice(),
                    gate: view(gate)?.slice(),
                },
                view(gate)?,
            ),
            MatmulInput::GeluMul { gate, up } => (
                Step::GeluMul {
                    up: view(up)?.slice(),
                    gate: view(gate)?.slice(),
                },
                view(gate)?,
            ),
        }
    };
    let targets = stage
        .products
        .iter()
        .map(|p| {
            Ok(Target {
                w: p.w,
                bias: p.bias.map(|b| b.values.as_slice()),
                accumulate: p.accumulate,
                // SAFETY: as for the step's views above.
                out: unsafe { view(p.out)?.slice() },
            })
        })
        .collect::<Result<Vec<_>, KernelError>>()?;
    let (n, k) = (rows.rows, rows.cols);
    Ok(Stage::new(pool, RowSteps::new(isa, k, step), targets, n, k))
}
