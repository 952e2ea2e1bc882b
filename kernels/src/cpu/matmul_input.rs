//! The rows a matmul multiplies and the elementwise step that makes them
//! (RMS norm before Q/K/V and gate/up, SiLU or GELU gating before down).
//!
//! A quantized matmul job runs the step row by row in its first phase,
//! each row quantized by the task that made it, so the step, the
//! quantization and the products take one job and no serial work on the
//! caller. At batch 16 a step or a quantization of its own was a few
//! microseconds of work behind a pool job's synchronisation or on the
//! caller alone while the worker waited. A row's arithmetic is the
//! unfused kernels' (`norm::rms_norm_row`, `exp::silu_mul` and
//! `activation::gelu_mul_row` on the row), so fusing changes no bit.

use super::activation;
use super::cpu_backend::CpuBackend;
use super::disjoint::DisjointSlice;
use super::elementwise;
use super::exp;
use super::isa::CheckedIsa;
use super::norm::{self, rms_norm_row};
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::{KernelError, MatmulInput};

/// The input of [`super::matmul::matmul_many`] (see `MatmulInput`).
pub(crate) enum Input<'a> {
    Rows(&'a CpuActivations),
    RmsNorm {
        x: &'a CpuActivations,
        weight: &'a [f32],
        eps: f32,
        out: &'a mut CpuActivations,
    },
    SiluMul {
        gate: &'a mut CpuActivations,
        up: &'a CpuActivations,
    },
    GeluMul {
        gate: &'a mut CpuActivations,
        up: &'a CpuActivations,
    },
}

impl<'a> From<MatmulInput<'a, CpuBackend>> for Input<'a> {
    fn from(input: MatmulInput<'a, CpuBackend>) -> Self {
        match input {
            MatmulInput::Rows(x) => Input::Rows(x),
            MatmulInput::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => Input::RmsNorm {
                x,
                weight: &weight.values,
                eps,
                out,
            },
            MatmulInput::SiluMul { gate, up } => Input::SiluMul { gate, up },
            MatmulInput::GeluMul { gate, up } => Input::GeluMul { gate, up },
        }
    }
}

impl<'a> Input<'a> {
    /// Rows and columns of what the products take.
    pub(crate) fn shape(&self) -> (usize, usize) {
        match self {
            Input::Rows(x) | Input::RmsNorm { x, .. } => (x.rows, x.cols),
            Input::SiluMul { gate, .. } | Input::GeluMul { gate, .. } => (gate.rows, gate.cols),
        }
    }

    /// Checks the step's operands as the unfused kernels do.
    pub(crate) fn validate(&self) -> Result<(), KernelError> {
        match self {
            Input::Rows(_) => Ok(()),
            Input::RmsNorm { x, weight, out, .. } => norm::check_shapes(x, weight, out),
            Input::SiluMul { gate, up } => elementwise::same_shape("silu_mul", gate, up),
            Input::GeluMul { gate, up } => elementwise::same_shape("gelu_mul", gate, up),
        }
    }

    /// Runs the step as a job of its own and returns its rows: for float
    /// weights, which read the f32 rows.
    pub(crate) fn finish(
        self,
        pool: &ThreadPool,
        isa: CheckedIsa,
    ) -> Result<&'a CpuActivations, KernelError> {
        match self {
            Input::Rows(x) => Ok(x),
            Input::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => {
                norm::rms_norm(pool, x, weight, eps, out)?;
                Ok(out)
            }
            Input::SiluMul { gate, up } => {
                elementwise::silu_mul(pool, isa, gate, up)?;
                Ok(gate)
            }
            Input::GeluMul { gate, up } => {
                activation::gelu_mul(pool, isa, gate, up)?;
                Ok(gate)
            }
        }
    }

    /// The step lent to the tasks of one job, a row at a time (the caller
    /// validated the operands).
    pub(crate) fn by_rows(self, isa: CheckedIsa) -> RowSteps<'a> {
        let cols = self.shape().1;
        // SAFETY (each `reading`): the step only reads `x` and `up`.
        let step = match self {
            Input::Rows(x) => Step::Rows(unsafe { DisjointSlice::reading(&x.data) }),
            Input::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => Step::RmsNorm {
                x: unsafe { DisjointSlice::reading(&x.data) },
                weight,
                eps,
                out: DisjointSlice::new(&mut out.data),
            },
            Input::SiluMul { gate, up } => Step::SiluMul {
                up: unsafe { DisjointSlice::reading(&up.data) },
                gate: DisjointSlice::new(&mut gate.data),
            },
            Input::GeluMul { gate, up } => Step::GeluMul {
                up: unsafe { DisjointSlice::reading(&up.data) },
                gate: DisjointSlice::new(&mut gate.data),
            },
        };
        RowSteps::new(isa, cols, step)
    }
}

/// The elementwise step of a matmul's input over views of its buffers
/// (read views only read from; see [`RowSteps::row`]).
pub(crate) enum Step<'a> {
    Rows(DisjointSlice<'a, f32>),
    RmsNorm {
        x: DisjointSlice<'a, f32>,
        weight: &'a [f32],
        eps: f32,
        out: DisjointSlice<'a, f32>,
    },
    SiluMul {
        up: DisjointSlice<'a, f32>,
        gate: DisjointSlice<'a, f32>,
    },
    GeluMul {
        up: DisjointSlice<'a, f32>,
        gate: DisjointSlice<'a, f32>,
    },
}

/// An [`Input`] whose rows tasks make one by one.
pub(crate) struct RowSteps<'a> {
    isa: CheckedIsa,
    cols: usize,
    step: Step<'a>,
}

impl<'a> RowSteps<'a> {
    /// `step` on rows of `cols` columns.
    pub(crate) fn new(isa: CheckedIsa, cols: usize, step: Step<'a>) -> Self {
        RowSteps { isa, cols, step }
    }

    /// Runs the step on row `r` and returns the row the products take.
    ///
    /// # Safety
    /// No other thread may touch row `r` of the step's output, nor write
    /// row `r` of its inputs, while the call and the returned borrow last.
    pub(crate) unsafe fn row(&self, r: usize) -> &[f32] {
        let k = self.cols;
        let at = r * k;
        // SAFETY (every `get` and `range`): row r is the caller's alone.
        match &self.step {
            Step::Rows(x) => unsafe { x.get(at, k) },
            Step::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => {
                let o = unsafe { out.range(at, k) };
                rms_norm_row(unsafe { x.get(at, k) }, weight, *eps, o);
                o
            }
            Step::SiluMul { up, gate } => {
                let g = unsafe { gate.range(at, k) };
                exp::silu_mul(self.isa, g, unsafe { up.get(at, k) });
                g
            }
            Step::GeluMul { up, gate } => {
                let g = unsafe { gate.range(at, k) };
                activation::gelu_mul_row(self.isa, g, unsafe { up.get(at, k) });
                g
            }
        }
    }
}
