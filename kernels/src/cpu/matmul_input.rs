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
use super::disjoint::DisjointSlice;
use super::elementwise;
use super::exp;
use super::isa::CheckedIsa;
use super::norm::{self, rms_norm_row};
use super::tensors::CpuActivations;
use super::threads::ThreadPool;
use crate::KernelError;

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
        match self {
            Input::Rows(x) => RowSteps {
                isa,
                cols: x.cols,
                step: Step::Rows(x),
            },
            Input::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => RowSteps {
                isa,
                cols: x.cols,
                step: Step::RmsNorm {
                    x,
                    weight,
                    eps,
                    out: DisjointSlice::new(&mut out.data),
                },
            },
            Input::SiluMul { gate, up } => RowSteps {
                isa,
                cols: gate.cols,
                step: Step::SiluMul {
                    up,
                    gate: DisjointSlice::new(&mut gate.data),
                },
            },
            Input::GeluMul { gate, up } => RowSteps {
                isa,
                cols: gate.cols,
                step: Step::GeluMul {
                    up,
                    gate: DisjointSlice::new(&mut gate.data),
                },
            },
        }
    }
}

enum Step<'a> {
    Rows(&'a CpuActivations),
    RmsNorm {
        x: &'a CpuActivations,
        weight: &'a [f32],
        eps: f32,
        out: DisjointSlice<'a, f32>,
    },
    SiluMul {
        up: &'a CpuActivations,
        gate: DisjointSlice<'a, f32>,
    },
    GeluMul {
        up: &'a CpuActivations,
        gate: DisjointSlice<'a, f32>,
    },
}

/// An [`Input`] whose rows tasks make one by one.
pub(crate) struct RowSteps<'a> {
    isa: CheckedIsa,
    cols: usize,
    step: Step<'a>,
}

impl RowSteps<'_> {
    /// Runs the step on row `r` and returns the row the products take.
    ///
    /// # Safety
    /// No other thread may touch row `r` of the step's output while the
    /// call and the returned borrow last.
    pub(crate) unsafe fn row(&self, r: usize) -> &[f32] {
        let (k, span) = (self.cols, r * self.cols..(r + 1) * self.cols);
        match &self.step {
            Step::Rows(x) => &x.data[span],
            Step::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => {
                // SAFETY: row r is the caller's alone.
                let o = unsafe { out.range(r * k, k) };
                rms_norm_row(&x.data[span], weight, *eps, o);
                o
            }
            Step::SiluMul { up, gate } => {
                // SAFETY: row r is the caller's alone.
                let g = unsafe { gate.range(r * k, k) };
                exp::silu_mul(self.isa, g, &up.data[span]);
                g
            }
            Step::GeluMul { up, gate } => {
                // SAFETY: row r is the caller's alone.
                let g = unsafe { gate.range(r * k, k) };
                activation::gelu_mul_row(self.isa, g, &up.data[span]);
                g
            }
        }
    }
}
