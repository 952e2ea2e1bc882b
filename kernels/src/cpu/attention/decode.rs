//! A decode step's key block in one pass: one query row's heads of a GQA
//! group against one KV head's run, read in place from the cache.
//!
//! The per-row path (`stream`) widens an F16 run into an f32 copy, then
//! takes the scores, the softmax step and the weighted sum, each a call of
//! its own through the tile's state. At depth a decode step is that loop
//! and little else, so the copy (a store and a reload of every element)
//! and the calls cost about what the arithmetic does. Here each key row
//! and value row is widened as it is loaded (`vcvtph2ps`, once per sixteen
//! elements, shared by every head of the group), the scores stay on the
//! stack, and the same operations run in the same order: the scores'
//! four chains (`scores`), `online_step`, the rescale, and the weighted
//! sum's chain over the block's positions (`vecmath`), so every output is
//! bit for bit the per-row path's (tested), and a prompt's rows still
//! equal their decode steps.
//!
//! Each line it loads, it asks for the same line two key blocks further
//! down the head's stream (`x86::AHEAD_BLOCKS`): at depth the fold had
//! been waiting on its loads, not computing. A prefetch changes no result.
//!
//! AVX-512 only, for heads of a multiple of sixteen dimensions (every
//! model here); anything else takes the per-row path.

use std::ops::Range;

use super::online::online_step;
use super::scores::GROUP_MAX;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::Direct;
use crate::cpu::kv_layout::KEY_BLOCK;
#[cfg(target_arch = "x86_64")]
use crate::cpu::vecmath::scale_in_place;
#[cfg(target_arch = "x86_64")]
use crate::cpu::Isa;

/// Whether [`fold_row`] takes heads of `head_dim` on `isa`.
pub(super) fn fast(isa: CheckedIsa, head_dim: usize) -> bool {
    let simd = match isa.get() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => true,
        _ => false,
    };
    simd && head_dim > 0 && head_dim.is_multiple_of(16)
}

/// One query row's running softmax states for a group of heads: `max`
/// and `sum` per head, `acc` (`head_dim` per head) the unnormalised
/// output, as `stream`'s tile state keeps them.
pub(super) struct RowState<'a> {
    pub(super) max: &'a mut [f32],
    pub(super) sum: &'a mut [f32],
    pub(super) acc: &'a mut [f32],
}

/// Folds positions `lanes` of the key block `run` (keys and values of one
/// KV head, the layout of `kv_layout`) into the states of the heads
/// `qs` (each `head_dim` long; any number, [`GROUP_MAX`] at a time).
/// `false`, with nothing changed, where [`fast`] does not hold or the
/// lengths do not fit; the caller then takes the per-row path.
pub(super) fn fold_row(
    isa: CheckedIsa,
    run: Direct<'_>,
    qs: &[&[f32]],
    scale: f32,
    lanes: Range<usize>,
    state: RowState<'_>,
) -> bool {
    let hd = qs.first().map_or(0, |q| q.len());
    let g = qs.len();
    let run_len = match run {
        Direct::F32(r) => r.len(),
        Direct::F16(r) => r.len(),
    };
    let fits = fast(isa, hd)
        && qs.iter().all(|q| q.len() == hd)
        && run_len >= 2 * KEY_BLOCK * hd
        && lanes.start < lanes.end
        && lanes.end <= KEY_BLOCK
        && state.max.len() >= g
        && state.sum.len() >= g
        && state.acc.len() >= g * hd;
    if !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    for h0 in (0..g).step_by(GROUP_MAX) {
        let n = (g - h0).min(GROUP_MAX);
        let heads = h0..h0 + n;
        let group = x86::Group {
            qs: &qs[heads.clone()],
            scale,
            lanes: (lanes.start, lanes.end),
            max: &mut state.max[heads.clone()],
            sum: &mut state.sum[heads.clone()],
            acc: &mut state.acc[h0 * hd..(h0 + n) * hd],
        };
        // SAFETY: `fast` checked AVX-512 F and `hd % 16 == 0`; `fits`
        // checked the run's, the queries' and the states' lengths and
        // `lanes` inside one key block.
        unsafe {
            match (run, n) {
                (Direct::F16(r), 1) => x86::fold::<1, true>(isa, r.as_ptr().cast(), group),
                (Direct::F16(r), 2) => x86::fold::<2, true>(isa, r.as_ptr().cast(), group),
                (Direct::F16(r), 3) => x86::fold::<3, true>(isa, r.as_ptr().cast(), group),
                (Direct::F16(r), _) => x86::fold::<4, true>(isa, r.as_ptr().cast(), group),
                (Direct::F32(r), 1) => x86::fold::<1, false>(isa, r.as_ptr().cast(), group),
                (Direct::F32(r), 2) => x86::fold::<2, false>(isa, r.as_ptr().cast(), group),
                (Direct::F32(r), 3) => x86::fold::<3, false>(isa, r.as_ptr().cast(), group),
                (Direct::F32(r), _) => x86::fold::<4, false>(isa, r.as_ptr().cast(), group),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (scale, state);
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{online_step, scale_in_place, CheckedIsa, KEY_BLOCK};
    use crate::cpu::kv_layout::KEY_TILE;

    /// The heads of one pass and their states (see `super::fold_row`).
    pub(super) struct Group<'a, 'q> {
        pub(super) qs: &'a [&'q [f32]],
        pub(super) scale: f32,
        pub(super) lanes: (usize, usize),
        pub(super) max: &'a mut [f32],
        pub(super) sum: &'a mut [f32],
        pub(super) acc: &'a mut [f32],
    }

    /// Sixteen elements of the run from element `at` as f32: f16 widened
    /// (exact), f32 as they are.
    ///
    /// # Safety
    /// AVX-512 F; `at + 16` elements inside the run.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load<const F16: bool>(run: *const u8, at: usize) -> __m512 {
        // SAFETY: the caller's.
        unsafe {
            if F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(run.add(2 * at).cast()))
            } else {
                _mm512_loadu_ps(run.add(4 * at).cast())
            }
        }
    }

    /// Key blocks ahead of the one being folded that [`ahead`] asks for.
    /// A head's key blocks follow each other in a block of the cache, so
    /// this is a steady distance down the stream the fold reads; the
    /// hardware prefetchers alone left the fold waiting on the key and
    /// value loads at depth (half its samples each), since they stop at
    /// every 4 KB page and one core's stream has few misses in flight.
    /// Paired at depth 4096, two threads: SmolLM2 86-89 -> 131-155 tok/s
    /// (1, 2, 4 blocks within noise of each other), Gemma 3 83 -> 87-95 (2
    /// ahead did best). Asking for a whole block at once at its start was
    /// slower (`stream::Tile::prefetch`): a burst of 64-256 requests.
    const AHEAD_BLOCKS: usize = 2;

    /// Asks for the line `next` bytes past element `at` of the run: the
    /// same line of a later key block of the head's stream. A hint: it
    /// never faults, whatever the address.
    #[inline(always)]
    fn ahead<const F16: bool>(run: *const u8, at: usize, next: usize) {
        let line = run
            .wrapping_add(at * if F16 { 2 } else { 4 } + next)
            .cast::<i8>();
        // SAFETY: SSE is part of x86_64; a prefetch cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line) }
    }

    /// `super::fold_row` for `G` heads of a run of f16 (`F16`) or f32.
    ///
    /// # Safety
    /// AVX-512 F; the lengths `super::fold_row` checks, `G == qs.len()`.
    // Index loops over constant bounds: fully unrolled, every chain a
    // register (as in `scores` and `vecmath`).
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fold<const G: usize, const F16: bool>(
        isa: CheckedIsa,
        run: *const u8,
        group: Group<'_, '_>,
    ) {
        let Group {
            qs,
            scale,
            lanes: (lo, n),
            max,
            sum,
            acc,
        } = group;
        let hd = qs[0].len();
        // Bytes from a line of this run to the same line of the run
        // `AHEAD_BLOCKS` key blocks on (see `ahead`).
        let next = AHEAD_BLOCKS * 2 * KEY_BLOCK * hd * if F16 { 2 } else { 4 };
        let q: [*const f32; G] = std::array::from_fn(|g| qs[g].as_ptr());
        // Scores, then probabilities, per head: `scores16`'s four chains
        // over the dimensions `d ≡ 0..3 (mod 4)`, `(p0 + p1) + (p2 + p3)`,
        // times the scale; the tiles past the block's last lane skipped.
        let mut p = [[0.0f32; KEY_BLOCK]; G];
        let s = _mm512_set1_ps(scale);
        for t in 0..n.div_ceil(KEY_TILE) {
            let tile = t * KEY_TILE * hd;
            let mut c = [[_mm512_setzero_ps(); 4]; G];
            for i in 0..hd / 4 {
                for k in 0..4 {
                    let d = 4 * i + k;
                    if !F16 || k.is_multiple_of(2) {
                        ahead::<F16>(run, tile + d * KEY_TILE, next);
                    }
                    // SAFETY: d < hd: inside the tile and every query.
                    let kv = unsafe { load::<F16>(run, tile + d * KEY_TILE) };
                    for g in 0..G {
                        let qd = _mm512_set1_ps(unsafe { *q[g].add(d) });
                        c[g][k] = _mm512_fmadd_ps(qd, kv, c[g][k]);
                    }
                }
            }
            for g in 0..G {
                let total = _mm512_add_ps(
                    _mm512_add_ps(c[g][0], c[g][1]),
                    _mm512_add_ps(c[g][2], c[g][3]),
                );
                // SAFETY: lanes 16·t.. of a row of 32 (t < 2).
                unsafe {
                    _mm512_storeu_ps(p[g].as_mut_ptr().add(t * KEY_TILE), _mm512_mul_ps(total, s))
                };
            }
        }
        // The softmax step per head, and the rescale of its output so far.
        for g in 0..G {
            if let Some(c) = online_step(isa, &mut p[g][lo..n], &mut max[g], &mut sum[g]) {
                scale_in_place(isa, c, &mut acc[g * hd..(g + 1) * hd]);
            }
        }
        // The weighted sum: 64 output elements of every head at a time,
        // each a chain over the positions in order (`weighted_sum_group`).
        let values = KEY_BLOCK * hd;
        let a = acc.as_mut_ptr();
        let mut c = 0;
        while c < hd {
            // SAFETY: columns c.. of every head's output and of the
            // value rows lo..n, inside `acc` and the run.
            unsafe {
                match (hd - c) / 16 {
                    1 => chunk::<G, F16, 1>(run, a, &p, (hd, c), (values, next), (lo, n)),
                    2 => chunk::<G, F16, 2>(run, a, &p, (hd, c), (values, next), (lo, n)),
                    3 => chunk::<G, F16, 3>(run, a, &p, (hd, c), (values, next), (lo, n)),
                    _ => chunk::<G, F16, 4>(run, a, &p, (hd, c), (values, next), (lo, n)),
                }
            }
            c += 64;
        }
    }

    /// `16·K` columns from `c` of the `G` heads' outputs (`acc`, `hd`
    /// apart) += `Σ_j p[g][j] · value_j`, `j` in `lo..n` in order.
    ///
    /// # Safety
    /// AVX-512 F; `c + 16·K <= hd`; `acc` holds `G·hd`, the run's values
    /// (from element `values`) hold rows up to `n`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    unsafe fn chunk<const G: usize, const F16: bool, const K: usize>(
        run: *const u8,
        acc: *mut f32,
        p: &[[f32; KEY_BLOCK]; G],
        (hd, c): (usize, usize),
        (values, next): (usize, usize),
        (lo, n): (usize, usize),
    ) {
        let mut sum = [[_mm512_setzero_ps(); K]; G];
        for g in 0..G {
            for k in 0..K {
                // SAFETY: the caller's.
                sum[g][k] = unsafe { _mm512_loadu_ps(acc.add(g * hd + c + 16 * k)) };
            }
        }
        for j in lo..n {
            let at = values + j * hd + c;
            let mut row = [_mm512_setzero_ps(); K];
            for k in 0..K {
                if !F16 || k.is_multiple_of(2) {
                    ahead::<F16>(run, at + 16 * k, next);
                }
                // SAFETY: the caller's.
                row[k] = unsafe { load::<F16>(run, at + 16 * k) };
            }
            for g in 0..G {
                let w = _mm512_set1_ps(p[g][j]);
                for k in 0..K {
                    sum[g][k] = _mm512_fmadd_ps(w, row[k], sum[g][k]);
                }
            }
        }
        for g in 0..G {
            for k in 0..K {
                // SAFETY: the caller's.
                unsafe { _mm512_storeu_ps(acc.add(g * hd + c + 16 * k), sum[g][k]) };
            }
        }
    }
}
