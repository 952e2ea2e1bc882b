//! Partial softmax states and how they combine.
//!
//! A query's attention over some positions is the state `(max, sum, acc)`:
//! the largest score `m`, `Σ e^(s−m)` and `Σ e^(s−m)·v`. The positions are
//! cut into segments of [`SEGMENT`] positions at fixed multiples of
//! the position (not of anything about the call), every segment's state is
//! computed from an empty one, and the states are merged in position order
//! with [`merge`]. Whether one task walks every segment and merges as it
//! goes, or one task per segment leaves its state in a buffer and the last
//! to finish merges them (flash-decoding: a deep context split across threads),
//! the operations are the same, so a row's output does not depend on how
//! the call was split, batched or chunked.

use crate::cpu::exp::exp_one;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_layout::KEY_BLOCK;
use crate::cpu::vecmath::{scale_add, scale_in_place};

/// Positions per segment: one block of the default size
/// (`kv::DEFAULT_BLOCK_POSITIONS`), so a task of a split context
/// streams its KV head's run of one block. Contexts up to 1k stay one
/// segment (one task per KV head and tile); at 4k a decode step has
/// twelve tasks over three KV heads. SmolLM2 decode at 4k/8k measured
/// 190/126 tok/s with segments of 1024 against 172/114 with 512 (blocks of
/// 1024 both). The merge costs two `exp` and one pass over `head_dim` per
/// segment, next to 1024 × 2 × `head_dim` multiply-adds.
pub(super) const SEGMENT: usize = 1024;

/// Positions per segment in a layer whose rows see `window` positions
/// (`None`: every position before them): [`SEGMENT`], or, for a window
/// shorter than two of them, the largest power of two (of whole key
/// blocks) at most half the window, so that a decode step's window spans
/// two or three segments and splits across two threads. With
/// [`SEGMENT`] Gemma 3's 512-position window was one segment at most
/// positions: one task, one thread busy and the other waiting, in 15 of
/// its 18 layers. Prompt rows and decode steps of a layer use the same
/// length, so splitting still changes no result.
pub(super) fn segment_len(window: Option<usize>) -> usize {
    match window {
        Some(w) if w < 2 * SEGMENT => 1 << (w / 2).max(KEY_BLOCK).ilog2(),
        _ => SEGMENT,
    }
}

/// Floats one query's state takes in a buffer: max, sum, then `head_dim`.
pub(super) const fn state_len(head_dim: usize) -> usize {
    head_dim + 2
}

/// `into ← into ⊕ from`. An empty state (sum 0) on either side is left
/// out, so merging into an empty state copies.
#[inline]
pub(super) fn merge(
    isa: CheckedIsa,
    into: (&mut f32, &mut f32, &mut [f32]),
    from: (f32, f32, &[f32]),
) {
    let (into_max, into_sum, into_acc) = into;
    let (max, sum, acc) = from;
    if sum == 0.0 {
        return;
    }
    if *into_sum == 0.0 {
        *into_max = max;
        *into_sum = sum;
        into_acc.copy_from_slice(acc);
        return;
    }
    let m = into_max.max(max);
    let (a, b) = (exp_one(isa, *into_max - m), exp_one(isa, max - m));
    *into_sum = b.mul_add(sum, *into_sum * a);
    scale_add(isa, a, into_acc, b, acc);
    *into_max = m;
}

/// The attention output of a merged state: `acc / sum`, in place.
#[inline]
pub(super) fn normalize(isa: CheckedIsa, sum: f32, acc: &mut [f32]) {
    scale_in_place(isa, 1.0 / sum, acc);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;

    /// A short window spans two or three segments of whole key blocks; a
    /// long one, or none, keeps the default.
    #[test]
    fn short_windows_take_shorter_segments() {
        assert_eq!(segment_len(None), SEGMENT);
        assert_eq!(segment_len(Some(4096)), SEGMENT);
        assert_eq!(segment_len(Some(2048)), SEGMENT);
        assert_eq!(segment_len(Some(512)), 256);
        assert_eq!(segment_len(Some(600)), 256);
        assert_eq!(segment_len(Some(1500)), 512);
        assert_eq!(segment_len(Some(1)), KEY_BLOCK);
        for w in 1..2 * SEGMENT {
            let s = segment_len(Some(w));
            assert!(
                s.is_multiple_of(KEY_BLOCK) && s <= SEGMENT,
                "window {w}: {s}"
            );
            assert!(w < 2 * KEY_BLOCK || w.div_ceil(s) >= 2, "window {w}: {s}");
        }
    }

    /// Two halves merged give the softmax-weighted sum of the whole: the
    /// reference here is the two-pass softmax in f64, and the merged state
    /// carries three roundings per element more than one pass would, so
    /// 1e-6 relative leaves margin.
    #[test]
    fn merging_halves_matches_the_whole() {
        let scores = [0.5f32, 3.0, -1.0, 2.5, 7.0, -4.0];
        let values: Vec<[f32; 2]> = (0..6).map(|i| [i as f32, 1.0 - i as f32]).collect();
        let state = |r: std::ops::Range<usize>| {
            let m = scores[r.clone()]
                .iter()
                .fold(f32::NEG_INFINITY, |a, b| a.max(*b));
            let (mut sum, mut acc) = (0.0f32, [0.0f32; 2]);
            for i in r {
                let w = (scores[i] - m).exp();
                sum += w;
                acc[0] += w * values[i][0];
                acc[1] += w * values[i][1];
            }
            (m, sum, acc)
        };
        let total: f64 = scores.iter().map(|s| f64::from(*s).exp()).sum();
        let want: Vec<f64> = (0..2)
            .map(|d| {
                scores
                    .iter()
                    .zip(&values)
                    .map(|(s, v)| f64::from(*s).exp() * f64::from(v[d]))
                    .sum::<f64>()
                    / total
            })
            .collect();
        for isa in Isa::supported() {
            let isa = CheckedIsa::at_most(isa);
            let (mut m, mut s, mut acc) = (f32::NEG_INFINITY, 0.0, [0.0f32; 2]);
            for r in [0..0, 0..4, 4..6] {
                let (pm, ps, pa) = state(r);
                merge(isa, (&mut m, &mut s, &mut acc), (pm, ps, &pa));
            }
            normalize(isa, s, &mut acc);
            for d in 0..2 {
                let err = (f64::from(acc[d]) - want[d]).abs();
                assert!(
                    err <= 1e-6 * want[d].abs().max(1.0),
                    "{isa:?} {d}: {} vs {}",
                    acc[d],
                    want[d]
                );
            }
        }
    }
}
