//! Splitting a step's rows by the tensor they read.
//!
//! A step can run several checkpoints of one architecture at once. Where
//! they hold the same stored tensor (the weight store shares identical
//! tensors), all their rows go through one kernel call, so a weight block
//! read from memory serves every row; where they differ, each checkpoint's
//! rows are gathered, run against its own tensor, and scattered back.

use std::ops::Range;

use smallvec::SmallVec;
use switchyard_kernels::{Backend, KernelError};

use super::ModelError;

/// Identity of the tensors one kernel call reads: the same stored tensor,
/// not merely equal values (the store already made equal tensors one).
pub(super) trait SameTensor: Copy {
    fn same(self, other: Self) -> bool;
}

impl<T> SameTensor for &T {
    fn same(self, other: Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// A weight and its optional bias.
impl<T, U> SameTensor for (&T, Option<&U>) {
    fn same(self, other: Self) -> bool {
        let bias = match (self.1, other.1) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        };
        std::ptr::eq(self.0, other.0) && bias
    }
}

/// Consecutive rows that read the same tensors.
pub(super) struct Run<K> {
    pub(super) rows: Range<usize>,
    pub(super) tensor: K,
}

/// A step's runs of one tensor, held without an allocation when they are
/// few: a step makes a dozen lists a layer, and usually each is one run
/// (one checkpoint, or several sharing the tensor).
pub(super) type Runs<K> = SmallVec<[Run<K>; 2]>;

/// Merges each part's rows (`rows[i]` reads `tensors[i]`) into runs of
/// adjacent parts that read the same tensors. Parts with no rows are skipped.
pub(super) fn runs<K: SameTensor>(
    rows: &[Range<usize>],
    tensors: impl IntoIterator<Item = K>,
) -> Runs<K> {
    let mut out: Runs<K> = SmallVec::new();
    for (range, tensor) in rows.iter().zip(tensors) {
        if range.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.tensor.same(tensor) && last.rows.end == range.start => {
                last.rows.end = range.end;
            }
            _ => out.push(Run {
                rows: range.clone(),
                tensor,
            }),
        }
    }
    out
}

/// Buffers for the rows of one run while they are apart from the rest.
pub(super) struct Gather<B: Backend> {
    pub(super) input: B::Activations,
    pub(super) output: B::Activations,
}

impl<B: Backend> Gather<B> {
    pub(super) fn new(backend: &B) -> Self {
        Gather {
            input: backend.activations(0, 0),
            output: backend.activations(0, 0),
        }
    }
}

/// Widths of an operation's input and output rows.
#[derive(Clone, Copy)]
pub(super) struct Widths {
    pub(super) input: usize,
    pub(super) output: usize,
}

/// Runs `op(x, tensor, out)` for each run's rows: on the whole of `x` and
/// `out` when one run covers every row, else gathered run by run.
pub(super) fn by_runs<B: Backend, K: SameTensor>(
    backend: &B,
    runs: &[Run<K>],
    x: &B::Activations,
    out: &mut B::Activations,
    widths: Widths,
    gather: &mut Gather<B>,
    op: impl Fn(&B::Activations, K, &mut B::Activations) -> Result<(), KernelError>,
) -> Result<(), ModelError> {
    if let [only] = runs {
        return Ok(op(x, only.tensor, out)?);
    }
    for run in runs {
        let len = run.rows.len();
        backend.resize(&mut gather.input, len, widths.input);
        backend.copy_rows(x, run.rows.clone(), &mut gather.input, 0)?;
        backend.resize(&mut gather.output, len, widths.output);
        op(&gather.input, run.tensor, &mut gather.output)?;
        backend.copy_rows(&gather.output, 0..len, out, run.rows.start)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_parts_on_the_same_tensor_merge_and_others_split() {
        let (a, b) = (1u8, 1u8);
        let rows = [0..2, 2..3, 3..3, 3..6, 6..7];
        let merged = runs(&rows, [&a, &a, &b, &b, &a]);
        let got: Vec<_> = merged.iter().map(|r| r.rows.clone()).collect();
        // The empty part is skipped, so the two parts on `b` meet.
        assert_eq!(got, [0..3, 3..6, 6..7]);
        assert!(std::ptr::eq(merged[1].tensor, &b));
    }

    #[test]
    fn a_different_bias_splits_a_shared_weight() {
        let (w, b1, b2) = (0u8, 1u8, 1u8);
        let rows = [0..1, 1..2, 2..3];
        let keys = [(&w, Some(&b1)), (&w, Some(&b1)), (&w, Some(&b2))];
        assert_eq!(runs(&rows, keys).len(), 2);
        let unbiased = [(&w, None::<&u8>), (&w, None)];
        assert_eq!(runs(&rows[..2], unbiased).len(), 1);
    }
}
