//! The CPU backend's buffers: weight matrices, parameter vectors and
//! activations.

use std::sync::Arc;

use super::packed::PackedRows;
use crate::{DType, KernelError, WeightView};

/// A weight matrix, kept zero-copy over the checkpoint's bytes, plus (for
/// the types and ISAs that have group kernels) its rows repacked sixteen at
/// a time. The checkpoint's bytes stay for row lookups (`embed`) and for
/// the tail rows that do not fill a group.
#[derive(Clone, Debug)]
pub struct CpuMatrix {
    pub(crate) view: WeightView,
    pub(crate) packed: Option<Arc<PackedRows>>,
}

impl CpuMatrix {
    /// The stored tensor.
    pub fn view(&self) -> &WeightView {
        &self.view
    }

    pub fn dtype(&self) -> DType {
        self.view.dtype
    }

    /// Output features (one per row).
    pub fn rows(&self) -> usize {
        self.view.rows
    }

    /// Input features (elements per row).
    pub fn cols(&self) -> usize {
        self.view.cols
    }

    /// The bytes of row `row`, or `None` past the last row.
    pub fn row_bytes(&self, row: usize) -> Option<&[u8]> {
        let width = self.view.row_bytes();
        let start = row.checked_mul(width)?;
        self.view.data.get(start..start.checked_add(width)?)
    }
}

/// A small f32 parameter vector (norm weights, biases).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuVector {
    pub(crate) values: Vec<f32>,
}

impl CpuVector {
    pub fn as_slice(&self) -> &[f32] {
        &self.values
    }
}

/// A row-major `rows × cols` f32 activation matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuActivations {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: Vec<f32>,
}

impl CpuActivations {
    /// Zero-filled `rows × cols`.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        CpuActivations {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// `rows × cols` holding `values`, which must have `rows × cols`
    /// elements.
    pub fn from_values(rows: usize, cols: usize, values: &[f32]) -> Result<Self, KernelError> {
        if values.len() != rows.saturating_mul(cols) {
            return Err(KernelError::Shape {
                op: "activations",
                detail: format!("{} values for {rows}×{cols}", values.len()),
            });
        }
        Ok(CpuActivations {
            rows,
            cols,
            data: values.to_vec(),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// All elements, row after row.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Row `row`, or `None` past the last row.
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        let start = row.checked_mul(self.cols)?;
        self.data.get(start..start.checked_add(self.cols)?)
    }

    /// `rows × cols` in `op`'s words, for shape errors.
    pub(crate) fn shape(&self) -> String {
        format!("{}×{}", self.rows, self.cols)
    }

    pub(crate) fn reshape(&mut self, rows: usize, cols: usize) {
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * cols, 0.0);
    }
}
