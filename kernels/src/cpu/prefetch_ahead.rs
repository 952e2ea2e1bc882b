//! Bytes a later job will read, asked for a few lines at a time by the
//! tasks of a compute-bound job running now.
//!
//! A decode step's LoRA update reads sixteen adapters' `A` and `Bᵀ`, cold
//! since the last step, and the few lines a core can have in flight make
//! that read wait on DRAM latency: read alone, it costs far more than its
//! bytes at the machine's bandwidth. The base's matmul just before it is
//! compute-bound (its weights are hot in L3), so its memory queue is
//! idle: its tasks ask for the adapters' lines into L2 as they go, a
//! share per weight group, and the LoRA job finds them there (or in the
//! other core's L2). A hint only: no effect on any result.

use std::ops::Range;

/// Cache lines.
const LINE: usize = 64;

/// The cache lines of a list of byte ranges, numbered in order.
pub(crate) struct Ahead<'a> {
    slices: Vec<&'a [u8]>,
    /// Lines before each slice; the last entry is the total.
    starts: Vec<usize>,
}

impl<'a> Ahead<'a> {
    pub(crate) fn new(slices: Vec<&'a [u8]>) -> Ahead<'a> {
        if slices.is_empty() {
            return Ahead::none();
        }
        let mut starts = Vec::with_capacity(slices.len() + 1);
        let mut lines = 0;
        starts.push(0);
        for s in &slices {
            lines += s.len().div_ceil(LINE);
            starts.push(lines);
        }
        Ahead { slices, starts }
    }

    /// Nothing to fetch (no allocation: every matmul without adapters
    /// makes one).
    pub(crate) fn none() -> Ahead<'static> {
        Ahead {
            slices: Vec::new(),
            starts: Vec::new(),
        }
    }

    pub(crate) fn lines(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Lines `part.start..part.end` of `whole`'s share of every line:
    /// `whole` counts units of work (weight groups), `part` the units of
    /// one task, so each task asks for lines in proportion to its work.
    pub(crate) fn share(&self, part: Range<usize>, whole: usize) -> Range<usize> {
        let lines = self.lines();
        let at = |u: usize| (lines * u).checked_div(whole).unwrap_or(0).min(lines);
        at(part.start)..at(part.end)
    }

    /// Asks for `lines` (numbered as in [`Ahead::share`]) into L2.
    pub(crate) fn fetch(&self, lines: Range<usize>) {
        if lines.is_empty() || self.slices.is_empty() {
            return;
        }
        // The slice holding the first line.
        let mut s = self
            .starts
            .partition_point(|&start| start <= lines.start)
            .saturating_sub(1);
        let mut line = lines.start;
        while line < lines.end && s < self.slices.len() {
            let (first, next) = (self.starts[s], self.starts[s + 1]);
            let data = self.slices[s];
            for l in line.max(first)..lines.end.min(next) {
                prefetch_l2(data, (l - first) * LINE);
            }
            line = next;
            s += 1;
        }
    }
}

/// One task's view of an [`Ahead`]: its groups `first_group..` are the
/// units `first_unit..` of the job's `whole`.
pub(crate) struct Spread<'a> {
    ahead: &'a Ahead<'a>,
    whole: usize,
    first_unit: usize,
    first_group: usize,
}

impl<'a> Spread<'a> {
    pub(crate) fn new(
        ahead: &'a Ahead<'a>,
        whole: usize,
        first_unit: usize,
        first_group: usize,
    ) -> Spread<'a> {
        Spread {
            ahead,
            whole,
            first_unit,
            first_group,
        }
    }

    /// Asks for group `group`'s share of the lines.
    #[inline]
    pub(crate) fn at(&self, group: usize) {
        if self.ahead.slices.is_empty() {
            return;
        }
        let unit = self.first_unit + group.saturating_sub(self.first_group);
        self.ahead.fetch(self.ahead.share(unit..unit + 1, self.whole));
    }
}

/// Asks for the line at `offset` of `data` into L2 (L2, not L1: the
/// current job's own lines fill L1).
#[inline]
fn prefetch_l2(data: &[u8], offset: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        if offset < data.len() {
            // SAFETY: SSE is part of x86_64; a prefetch reads nothing the
            // program sees and cannot fault. The address is inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(data.as_ptr().add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, offset);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shares cover every line once, in order, whatever the split.
    #[test]
    fn shares_cover_every_line_once() {
        let (a, b, c) = (vec![0u8; 130], vec![0u8; 64], vec![0u8; 1]);
        let ahead = Ahead::new(vec![&a, &b, &c]);
        assert_eq!(ahead.lines(), 3 + 1 + 1);
        for whole in [1usize, 2, 3, 7, 100] {
            let mut next = 0;
            for u in 0..whole {
                let share = ahead.share(u..u + 1, whole);
                assert_eq!(share.start, next);
                next = share.end;
                ahead.fetch(share);
            }
            assert_eq!(next, ahead.lines());
        }
        assert_eq!(Ahead::none().share(0..1, 1), 0..0);
        Ahead::none().fetch(0..0);
        assert_eq!(ahead.share(0..1, 0), 0..0);
    }

    /// A matmul told to fetch other matrices' bytes while it runs gives
    /// the bits it gives without them (packed groups and per-row tails,
    /// one and sixteen rows).
    #[test]
    fn fetching_ahead_changes_no_result() {
        use crate::cpu::{CpuActivations, CpuBackend};
        use crate::{Backend, DType, MatmulInput, MatmulProduct, WeightView};
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let backend = CpuBackend::new(2);
        let k = 128;
        let mut matrix = |rows: usize| {
            let values: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let bytes = crate::formats::quantize::quantize(DType::Q8_0, &values)
                .expect("Q8_0 of whole blocks");
            let view = WeightView::new(DType::Q8_0, rows, k, bytes::Bytes::from(bytes))
                .expect("bytes of the stated shape");
            backend.matrix(view).expect("a supported weight")
        };
        // 40 rows: two whole groups and a tail of 8.
        let (w1, w2, other) = (matrix(40), matrix(64), matrix(96));
        for n in [1usize, 16] {
            let x = CpuActivations::from_values(n, k, &(0..n * k).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<_>>())
                .expect("values of the stated shape");
            let run = |ahead: &[&crate::cpu::CpuMatrix]| {
                let (mut o1, mut o2) = (CpuActivations::zeros(n, 40), CpuActivations::zeros(n, 64));
                let mut products = [
                    MatmulProduct { w: &w1, bias: None, out: &mut o1, accumulate: false },
                    MatmulProduct { w: &w2, bias: None, out: &mut o2, accumulate: false },
                ];
                backend
                    .matmul_many_ahead(MatmulInput::Rows(&x), &mut products, ahead)
                    .expect("products shaped like the input");
                (o1.data, o2.data)
            };
            assert_eq!(run(&[]), run(&[&other, &w1]), "{n} rows");
        }
    }
}
