//! Moving whole activation rows between matrices of the same width.

use std::ops::Range;

use super::tensors::CpuActivations;
use crate::KernelError;

/// Copies rows `rows` of `src` into `dst` starting at row `dst_row`.
pub(crate) fn copy_rows(
    src: &CpuActivations,
    rows: Range<usize>,
    dst: &mut CpuActivations,
    dst_row: usize,
) -> Result<(), KernelError> {
    let cols = src.cols;
    let count = rows.len();
    let fits = cols == dst.cols
        && rows.start <= rows.end
        && rows.end <= src.rows
        && dst_row
            .checked_add(count)
            .is_some_and(|end| end <= dst.rows);
    if !fits {
        return Err(KernelError::Shape {
            op: "copy_rows",
            detail: format!(
                "rows {rows:?} of {} into {} from row {dst_row}",
                src.shape(),
                dst.shape()
            ),
        });
    }
    let from = &src.data[rows.start * cols..rows.end * cols];
    dst.data[dst_row * cols..(dst_row + count) * cols].copy_from_slice(from);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize, first: f32) -> CpuActivations {
        CpuActivations {
            rows,
            cols,
            data: (0..rows * cols).map(|i| first + i as f32).collect(),
        }
    }

    #[test]
    fn copies_the_rows_asked_for_and_nothing_else() {
        let src = matrix(4, 3, 0.0);
        let mut dst = matrix(3, 3, 100.0);
        copy_rows(&src, 1..3, &mut dst, 1).unwrap();
        assert_eq!(
            dst.data,
            [100.0, 101.0, 102.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
        );
    }

    #[test]
    fn refuses_rows_outside_either_matrix_or_a_width_mismatch() {
        let src = matrix(4, 3, 0.0);
        let mut dst = matrix(3, 3, 0.0);
        assert!(copy_rows(&src, 2..5, &mut dst, 0).is_err());
        assert!(copy_rows(&src, 0..2, &mut dst, 2).is_err());
        let mut narrow = matrix(3, 2, 0.0);
        assert!(copy_rows(&src, 0..1, &mut narrow, 0).is_err());
    }
}
