//! Sixteen attention scores at once from a key tile of the cache (sixteen
//! positions stored dimension-major, see `kv_store`): one broadcast
//! multiply-add per dimension, no horizontal sum per key.
//!
//! Order, the same on every ISA (so a score never depends on the ISA's
//! lanes or on which other rows share the tile): four partial sums over
//! the dimensions `d ≡ 0, 1, 2, 3 (mod 4)`, each a chain of fused
//! multiply-adds in increasing `d` starting from 0, then
//! `(p0 + p1) + (p2 + p3)`, then `× scale`. Four chains rather than one
//! keep the FMA unit busy instead of waiting on each result.

use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_layout::KEY_TILE;
#[cfg(any(target_arch = "x86_64", test))]
use crate::cpu::Isa;

/// `out[j] = scale · (q · key_j)` for the [`KEY_TILE`] keys of `tile`
/// (`q.len() · KEY_TILE` floats: dimension `d` of key `j` at
/// `d · KEY_TILE + j`).
pub(super) fn scores16(
    isa: CheckedIsa,
    q: &[f32],
    tile: &[f32],
    scale: f32,
    out: &mut [f32; KEY_TILE],
) {
    let tile = &tile[..q.len() * KEY_TILE];
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; `tile` holds
        // `q.len() · KEY_TILE` floats (cut above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::scores16(q, tile, scale, out) },
        // SAFETY: as above, with AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::scores16_avx2(q, tile, scale, out) },
        _ => scores16_scalar(q, tile, scale, out),
    }
}

/// How many queries share a pass over a tile.
mod group {
    /// Queries [`super::scores16_group`] takes at once: with four chains
    /// each, sixteen accumulators, a key row and a broadcast fit the 32
    /// AVX-512 registers.
    pub(crate) const GROUP_MAX: usize = 4;
}
pub(super) use group::GROUP_MAX;

/// [`scores16`] for up to [`GROUP_MAX`] queries against one tile, each
/// query's result bit for bit what `scores16` gives it: the same chains
/// in the same order; the queries only share each key row's load (a GQA
/// group reads one KV head, and a decode step is bound by those reads).
pub(super) fn scores16_group(
    isa: CheckedIsa,
    qs: &[&[f32]],
    tile: &[f32],
    scale: f32,
    out: &mut [[f32; KEY_TILE]; GROUP_MAX],
) {
    let hd = qs.first().map_or(0, |q| q.len());
    let tile = &tile[..hd * KEY_TILE];
    if qs.iter().any(|q| q.len() != hd) || qs.len() > GROUP_MAX {
        for (q, out) in qs.iter().zip(out.iter_mut()) {
            scores16(isa, q, tile, scale, out);
        }
        return;
    }
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; every query has `hd`
        // dimensions and `tile` holds `hd · KEY_TILE` floats (checked and
        // cut above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe {
            match qs.len() {
                1 => x86::scores16_group::<1>(qs, tile, scale, out),
                2 => x86::scores16_group::<2>(qs, tile, scale, out),
                3 => x86::scores16_group::<3>(qs, tile, scale, out),
                _ => x86::scores16_group::<4>(qs, tile, scale, out),
            }
        },
        _ => {
            for (q, out) in qs.iter().zip(out.iter_mut()) {
                scores16(isa, q, tile, scale, out);
            }
        }
    }
}

/// [`scores16_group`] over both key tiles of a key block at once (`tiles`:
/// the two tiles one after the other) for up to three queries, into
/// `out[g]`; `false` (nothing written) where the ISA or the group size has
/// no such kernel. Each broadcast of a query's dimension
/// serves both tiles, so a multiply-add costs 5/6 of a load instead of 4/3
/// (a prompt's scores were load-bound); every score is bit for bit what
/// `scores16` gives it (the same four chains).
pub(super) fn scores32_group(
    isa: CheckedIsa,
    qs: &[&[f32]],
    tiles: &[f32],
    scale: f32,
    out: &mut [[f32; 2 * KEY_TILE]],
) -> bool {
    let hd = qs.first().map_or(0, |q| q.len());
    let fits = hd > 0 && tiles.len() >= 2 * hd * KEY_TILE && out.len() >= qs.len();
    if !fits || qs.iter().any(|q| q.len() != hd) {
        return false;
    }
    let tiles = &tiles[..2 * hd * KEY_TILE];
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 F; every query has `hd`
        // dimensions and `tiles` holds two tiles of them (checked, cut).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe {
            match qs.len() {
                1 => x86::scores32_group::<1>(qs, tiles, scale, out),
                2 => x86::scores32_group::<2>(qs, tiles, scale, out),
                3 => x86::scores32_group::<3>(qs, tiles, scale, out),
                _ => return false,
            }
            true
        },
        _ => {
            let _ = (scale, out);
            false
        }
    }
}

pub(super) fn scores16_scalar(q: &[f32], tile: &[f32], scale: f32, out: &mut [f32; KEY_TILE]) {
    for (j, out) in out.iter_mut().enumerate() {
        let mut p = [0.0f32; 4];
        for (d, q) in q.iter().enumerate() {
            p[d % 4] = q.mul_add(tile[d * KEY_TILE + j], p[d % 4]);
        }
        *out = ((p[0] + p[1]) + (p[2] + p[3])) * scale;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::group::GROUP_MAX;
    use crate::cpu::kv_layout::KEY_TILE;

    /// # Safety
    /// AVX-512 F; `tile.len() == q.len() · KEY_TILE`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores16(q: &[f32], tile: &[f32], scale: f32, out: &mut [f32; KEY_TILE]) {
        // Four named accumulators: an array indexed by `d % 4` stays in
        // memory, and every multiply-add then waits on a store.
        let (mut p0, mut p1, mut p2, mut p3) = (
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
        );
        let t = tile.as_ptr();
        // SAFETY (every load): row d of the tile is inside `tile` (d < q.len()).
        let k = |d: usize| unsafe { _mm512_loadu_ps(t.add(d * KEY_TILE)) };
        let quads = q.len() / 4;
        for i in 0..quads {
            let d = 4 * i;
            p0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), k(d), p0);
            p1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), k(d + 1), p1);
            p2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]), k(d + 2), p2);
            p3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]), k(d + 3), p3);
        }
        let d = 4 * quads;
        let rest = q.len() - d;
        if rest > 0 {
            p0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), k(d), p0);
        }
        if rest > 1 {
            p1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), k(d + 1), p1);
        }
        if rest > 2 {
            p2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]), k(d + 2), p2);
        }
        let p = [p0, p1, p2, p3];
        let sum = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
        // SAFETY: `out` is sixteen f32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(sum, _mm512_set1_ps(scale))) };
    }

    /// [`scores16`] for `G` queries (`qs.len() == G`, each of
    /// `tile.len() / KEY_TILE` dimensions): per query the same four chains
    /// as `scores16`, in registers (constant indices after unrolling).
    ///
    /// # Safety
    /// AVX-512 F; the lengths above.
    // Index loops over constant bounds: fully unrolled, every `p[g][c]`
    // is a register; iterators over `p` would borrow the array instead.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores16_group<const G: usize>(
        qs: &[&[f32]],
        tile: &[f32],
        scale: f32,
        out: &mut [[f32; KEY_TILE]; GROUP_MAX],
    ) {
        let hd = tile.len() / KEY_TILE;
        let q: [*const f32; G] = std::array::from_fn(|g| qs[g].as_ptr());
        let mut p = [[_mm512_setzero_ps(); 4]; G];
        let t = tile.as_ptr();
        // SAFETY (every load): d < hd, inside every query and the tile.
        let k = |d: usize| unsafe { _mm512_loadu_ps(t.add(d * KEY_TILE)) };
        let qd = |g: usize, d: usize| unsafe { _mm512_set1_ps(*q[g].add(d)) };
        let quads = hd / 4;
        for i in 0..quads {
            for c in 0..4 {
                let d = 4 * i + c;
                let kv = k(d);
                for g in 0..G {
                    p[g][c] = _mm512_fmadd_ps(qd(g, d), kv, p[g][c]);
                }
            }
        }
        for c in 0..hd - 4 * quads {
            let d = 4 * quads + c;
            let kv = k(d);
            for g in 0..G {
                p[g][c] = _mm512_fmadd_ps(qd(g, d), kv, p[g][c]);
            }
        }
        let s = _mm512_set1_ps(scale);
        for g in 0..G {
            let sum = _mm512_add_ps(
                _mm512_add_ps(p[g][0], p[g][1]),
                _mm512_add_ps(p[g][2], p[g][3]),
            );
            // SAFETY: `out[g]` is sixteen f32.
            unsafe { _mm512_storeu_ps(out[g].as_mut_ptr(), _mm512_mul_ps(sum, s)) };
        }
    }

    /// [`super::scores32_group`]: per query and tile the same four chains
    /// as `scores16`, 24 accumulators for three queries.
    ///
    /// # Safety
    /// AVX-512 F; `tiles.len() == 2 · KEY_TILE · hd` with `hd` every
    /// query's length; `G <= 3` and `G <= out.len()`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores32_group<const G: usize>(
        qs: &[&[f32]],
        tiles: &[f32],
        scale: f32,
        out: &mut [[f32; 2 * KEY_TILE]],
    ) {
        let hd = tiles.len() / (2 * KEY_TILE);
        let q: [*const f32; G] = std::array::from_fn(|g| qs[g].as_ptr());
        let mut p = [[[_mm512_setzero_ps(); 4]; 2]; G];
        let t0 = tiles.as_ptr();
        let t1 = t0.wrapping_add(hd * KEY_TILE);
        // SAFETY (every load): d < hd, inside every query and both tiles.
        let k0 = |d: usize| unsafe { _mm512_loadu_ps(t0.add(d * KEY_TILE)) };
        let k1 = |d: usize| unsafe { _mm512_loadu_ps(t1.add(d * KEY_TILE)) };
        let qd = |g: usize, d: usize| unsafe { _mm512_set1_ps(*q[g].add(d)) };
        let quads = hd / 4;
        for i in 0..quads {
            for c in 0..4 {
                let d = 4 * i + c;
                let (a, b) = (k0(d), k1(d));
                for g in 0..G {
                    let qv = qd(g, d);
                    p[g][0][c] = _mm512_fmadd_ps(qv, a, p[g][0][c]);
                    p[g][1][c] = _mm512_fmadd_ps(qv, b, p[g][1][c]);
                }
            }
        }
        for c in 0..hd - 4 * quads {
            let d = 4 * quads + c;
            let (a, b) = (k0(d), k1(d));
            for g in 0..G {
                let qv = qd(g, d);
                p[g][0][c] = _mm512_fmadd_ps(qv, a, p[g][0][c]);
                p[g][1][c] = _mm512_fmadd_ps(qv, b, p[g][1][c]);
            }
        }
        let s = _mm512_set1_ps(scale);
        for g in 0..G {
            for t in 0..2 {
                let sum = _mm512_add_ps(
                    _mm512_add_ps(p[g][t][0], p[g][t][1]),
                    _mm512_add_ps(p[g][t][2], p[g][t][3]),
                );
                // SAFETY: `out[g]` is 32 f32; tile t's sixteen at 16·t.
                unsafe {
                    _mm512_storeu_ps(out[g].as_mut_ptr().add(t * KEY_TILE), _mm512_mul_ps(sum, s))
                };
            }
        }
    }

    /// [`scores16`] in two eight-lane halves: the same four chains per
    /// half (constant indices, so they stay in registers), the same sums.
    ///
    /// # Safety
    /// AVX2 and FMA; `tile.len() == q.len() · KEY_TILE`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores16_avx2(
        q: &[f32],
        tile: &[f32],
        scale: f32,
        out: &mut [f32; KEY_TILE],
    ) {
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        let t = tile.as_ptr();
        // SAFETY (every load): row d of the tile is inside `tile` (d < q.len()).
        let kl = |d: usize| unsafe { _mm256_loadu_ps(t.add(d * KEY_TILE)) };
        let kh = |d: usize| unsafe { _mm256_loadu_ps(t.add(d * KEY_TILE + 8)) };
        let quads = q.len() / 4;
        for i in 0..quads {
            for k in 0..4 {
                let d = 4 * i + k;
                let qv = _mm256_set1_ps(q[d]);
                lo[k] = _mm256_fmadd_ps(qv, kl(d), lo[k]);
                hi[k] = _mm256_fmadd_ps(qv, kh(d), hi[k]);
            }
        }
        for k in 0..q.len() - 4 * quads {
            let d = 4 * quads + k;
            let qv = _mm256_set1_ps(q[d]);
            lo[k] = _mm256_fmadd_ps(qv, kl(d), lo[k]);
            hi[k] = _mm256_fmadd_ps(qv, kh(d), hi[k]);
        }
        let s = _mm256_set1_ps(scale);
        let sum = |p: [__m256; 4]| {
            _mm256_mul_ps(
                _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                s,
            )
        };
        // SAFETY: `out` is sixteen f32.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), sum(lo));
            _mm256_storeu_ps(out.as_mut_ptr().add(8), sum(hi));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn simd_is_bit_identical_to_the_scalar_twin() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for isa in Isa::supported() {
            for hd in [1usize, 3, 4, 7, 33, 64, 128] {
                let q: Vec<f32> = (0..hd).map(|_| rng.random_range(-2.0..2.0)).collect();
                let tile: Vec<f32> = (0..hd * KEY_TILE)
                    .map(|_| rng.random_range(-2.0..2.0))
                    .collect();
                let (mut got, mut want) = ([0.0; KEY_TILE], [0.0; KEY_TILE]);
                scores16(CheckedIsa::at_most(isa), &q, &tile, 0.125, &mut got);
                scores16_scalar(&q, &tile, 0.125, &mut want);
                assert_eq!(got, want, "{isa} head_dim {hd}");
                for g in 1..=GROUP_MAX {
                    let qs: Vec<Vec<f32>> = (0..g)
                        .map(|_| (0..hd).map(|_| rng.random_range(-2.0..2.0)).collect())
                        .collect();
                    let refs: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();
                    let mut all = [[0.0; KEY_TILE]; GROUP_MAX];
                    scores16_group(CheckedIsa::at_most(isa), &refs, &tile, 0.125, &mut all);
                    for (q, got) in qs.iter().zip(&all) {
                        scores16_scalar(q, &tile, 0.125, &mut want);
                        assert_eq!(*got, want, "{isa} head_dim {hd} group {g}");
                    }
                    // Both tiles of a key block: the second tile is the
                    // first's keys negated and shifted.
                    let tiles: Vec<f32> = tile
                        .iter()
                        .copied()
                        .chain(tile.iter().map(|k| 0.5 - k))
                        .collect();
                    let mut both = [[0.0; 2 * KEY_TILE]; GROUP_MAX];
                    let isa = CheckedIsa::at_most(isa);
                    if !scores32_group(isa, &refs, &tiles, 0.125, &mut both) {
                        continue;
                    }
                    for (q, got) in qs.iter().zip(&both) {
                        for (t, half) in tiles.chunks_exact(hd * KEY_TILE).enumerate() {
                            scores16_scalar(q, half, 0.125, &mut want);
                            let got = &got[t * KEY_TILE..(t + 1) * KEY_TILE];
                            assert_eq!(got, want, "{isa:?} head_dim {hd} group {g} tile {t}");
                        }
                    }
                }
            }
            println!("scores bit-identical on {isa}");
        }
    }
}
