//! The shrink half of a LoRA update, `sums[j · n + g] = A row j · x row g`,
//! for up to four rows `x` of one run against every row of its adapter's
//! `A` (F32 or tiled BF16 (see `lora_elems`), widened to f32 in registers:
//! a tiled BF16 row sums as its plain one; Q8_0 adapters take `lora_q8`).
//!
//! A decode step's run is usually one row: against one row of `x`, the
//! general dot kernel (`dot_float`) sums each row of `A` in one chain of
//! fused multiply-adds, so each 16 elements wait for the previous ones'
//! result (four cycles) while the data would allow one a cycle. Here four
//! rows of `A` are summed at once (eight against a single row of `x`),
//! independent chains per row of `x`, each load of `x` serving them all. Each dot product sums exactly as
//! `dot_float`'s does (16 lanes in element order, the same reduction, the
//! same scalar tail), so the bits are `dot_float`'s whatever the grouping:
//! a row's update still does not depend on the rows beside it.

use super::dot::dot_float;
use super::isa::{CheckedIsa, Isa};
use super::lora_elems::Elems;
use crate::DType;

/// `sums[j · xs.len() + g] = A row j · xs[g]` for every row `j` of `a`
/// (`rank` rows of `xs[0].len()` elements of `dtype`: F32 or BF16
/// tiled), for up to four rows `xs` of equal length.
pub(crate) fn shrink(
    isa: CheckedIsa,
    dtype: DType,
    a: &[u8],
    rank: usize,
    xs: &[&[f32]],
    sums: &mut [f32],
) {
    let row_bytes = a.len().checked_div(rank).unwrap_or(0);
    match xs {
        [x0] => shrink_n::<1>(isa, dtype, a, row_bytes, &[x0], sums),
        [x0, x1] => shrink_n::<2>(isa, dtype, a, row_bytes, &[x0, x1], sums),
        [x0, x1, x2] => shrink_n::<3>(isa, dtype, a, row_bytes, &[x0, x1, x2], sums),
        [x0, x1, x2, x3] => shrink_n::<4>(isa, dtype, a, row_bytes, &[x0, x1, x2, x3], sums),
        _ => {}
    }
}

fn shrink_n<const R: usize>(
    isa: CheckedIsa,
    dtype: DType,
    a: &[u8],
    row_bytes: usize,
    x: &[&[f32]; R],
    sums: &mut [f32],
) {
    let k = x[0].len();
    let rows = a.len().checked_div(row_bytes).unwrap_or(0);
    let elems = Elems::of(dtype);
    let fits = elems.is_some()
        && dtype.bytes_for(k) == Some(row_bytes)
        && a.len() == rows * row_bytes
        && sums.len() >= rows * R
        && x.iter().all(|x| x.len() == k);
    match (isa.get(), elems) {
        // SAFETY: CheckedIsa guarantees the features; `fits` checked the
        // shapes the kernel reads and writes.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512 | Isa::Avx512Vnni, Some(elems)) if fits => unsafe {
            x86::shrink_avx512::<R>(elems, a, row_bytes, rows, x, sums)
        },
        // Elsewhere `dot_float` on the rows in element order (a copy: only
        // hosts without AVX-512 take it).
        (_, Some(Elems::Bf16Tiles)) if fits => {
            let plain = super::lora_elems::untile_bf16(a, k);
            dot_float::<R>(isa, dtype, &plain, row_bytes, x, &mut sums[..rows * R]);
        }
        // (On shapes `dot_float` refuses, its message.)
        _ => dot_float::<R>(isa, dtype, a, row_bytes, x, &mut sums[..rows * R]),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass `a` of `rows` rows of `row_bytes` bytes, each holding
    //! `x[r].len()` elements of `elems`, `sums` of at least `rows · R`
    //! values, and have AVX-512 F and BW.
    use std::arch::x86_64::*;

    use crate::cpu::lora_elems::{tail_start, tiled_offset, Elems, TILE};
    use crate::formats::blocks::{bf16_at, f32_at};

    /// `A`'s rows summed at once (the independent chains per row of `x`).
    const BLOCK: usize = 4;

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub(super) unsafe fn shrink_avx512<const R: usize>(
        elems: Elems,
        a: &[u8],
        row_bytes: usize,
        rows: usize,
        x: &[&[f32]; R],
        sums: &mut [f32],
    ) {
        let mut j = 0;
        // One row of `x` (a decode step's run): all eight rows of a rank-8
        // `A` at once, eight chains, each tile fetched in order.
        while R == 1 && j + 2 * BLOCK <= rows {
            block::<R, { 2 * BLOCK }>(elems, a, row_bytes, j, x, sums);
            j += 2 * BLOCK;
        }
        while j + BLOCK <= rows {
            block::<R, BLOCK>(elems, a, row_bytes, j, x, sums);
            j += BLOCK;
        }
        while j < rows {
            block::<R, 1>(elems, a, row_bytes, j, x, sums);
            j += 1;
        }
    }

    /// Sixteen elements of a row of `A` from element `i` (a multiple of
    /// 16; BF16 only from a tiled matrix's tail, rows in column order),
    /// widened to f32.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    #[inline]
    unsafe fn load16(elems: Elems, row: *const u8, i: usize) -> __m512 {
        match elems {
            Elems::Bf16 | Elems::Bf16Tiles => _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(2 * i).cast())),
                16,
            )),
            Elems::F32 => _mm512_loadu_ps(row.add(4 * i).cast()),
        }
    }

    /// Rows `j0..j0 + J` of `A` against every row of `x`.
    // Index loops over the register arrays: iterators would hide which
    // accumulator each fused multiply-add feeds.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    #[inline]
    unsafe fn block<const R: usize, const J: usize>(
        elems: Elems,
        a: &[u8],
        row_bytes: usize,
        j0: usize,
        x: &[&[f32]; R],
        sums: &mut [f32],
    ) {
        let k = x[0].len();
        let rank = a.len() / row_bytes;
        let tiled = elems == Elems::Bf16Tiles;
        let whole = if tiled { k / TILE * TILE } else { 0 };
        // Each row from its first element past the tiles: a tiled
        // matrix's tail (rows of `k - whole` in column order), or the row.
        let rows: [*const u8; J] = std::array::from_fn(|jj| {
            let j = j0 + jj;
            match elems {
                Elems::Bf16Tiles => a.as_ptr().add(tail_start(rank, k) + 2 * j * (k - whole)),
                _ => a.as_ptr().add(j * row_bytes),
            }
        });
        let mut acc = [[_mm512_setzero_ps(); R]; J];
        let mut i = 0;
        if tiled {
            // Whole tiles: 64 bytes widen to columns i..i + 16 (the low
            // halves) and i + 16..i + 32 (the high), summed in that order
            // as the loop below sums them. Tile (b, j) is at 64 · (b ·
            // rank + j): the J rows' tiles of a block are side by side.
            let high = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
            while i < whole {
                let mut xs = [[_mm512_setzero_ps(); 2]; R];
                for r in 0..R {
                    xs[r][0] = _mm512_loadu_ps(x[r].as_ptr().add(i));
                    xs[r][1] = _mm512_loadu_ps(x[r].as_ptr().add(i + 16));
                }
                let tiles = a.as_ptr().add(64 * ((i / TILE) * rank + j0));
                for jj in 0..J {
                    let w = _mm512_loadu_si512(tiles.add(64 * jj).cast());
                    let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w));
                    let hi = _mm512_castsi512_ps(_mm512_and_si512(w, high));
                    for r in 0..R {
                        acc[jj][r] = _mm512_fmadd_ps(lo, xs[r][0], acc[jj][r]);
                        acc[jj][r] = _mm512_fmadd_ps(hi, xs[r][1], acc[jj][r]);
                    }
                }
                i += TILE;
            }
        }
        while i + 16 <= k {
            // (A loop, not a closure: a closure would not inherit the
            // target features, and each intrinsic would become a call.)
            let mut xs = [_mm512_setzero_ps(); R];
            for r in 0..R {
                xs[r] = _mm512_loadu_ps(x[r].as_ptr().add(i));
            }
            for jj in 0..J {
                let w = load16(elems, rows[jj], i - whole);
                for r in 0..R {
                    acc[jj][r] = _mm512_fmadd_ps(w, xs[r], acc[jj][r]);
                }
            }
            i += 16;
        }
        for jj in 0..J {
            for r in 0..R {
                // As `dot_float`: the lanes reduced, then the tail in order.
                let mut sum = _mm512_reduce_add_ps(acc[jj][r]);
                for (t, x) in x[r].iter().enumerate().skip(i) {
                    let j = j0 + jj;
                    let weight = match elems {
                        Elems::Bf16Tiles => bf16_at(a, tiled_offset(rank, k, j, t)),
                        Elems::Bf16 => bf16_at(a, j * row_bytes + 2 * t),
                        Elems::F32 => f32_at(a, j * row_bytes + 4 * t),
                    };
                    sum += weight * x;
                }
                sums[(j0 + jj) * R + r] = sum;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// On every ISA the shrink gives `dot_float`'s bits, for every number
    /// of rows, ranks that end inside a block of four, and widths that end
    /// inside a vector.
    #[test]
    fn the_shrink_gives_the_dot_kernels_bits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for k in [5usize, 16, 32, 37, 48, 64, 80, 576] {
            for rank in [1usize, 3, 4, 8, 13] {
                let values: Vec<f32> = (0..rank * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                let xs: Vec<Vec<f32>> = (0..4)
                    .map(|_| (0..k).map(|_| rng.random_range(-1.0..1.0)).collect())
                    .collect();
                for dtype in [DType::F32, DType::BF16] {
                    let (a, _) = crate::cpu::lora_expand::tests::stored(dtype, k, &values);
                    // What `dot_float` reads: the same values in element
                    // order (BF16 unpaired).
                    let (plain, plain_dtype) = match dtype {
                        DType::BF16 => (crate::cpu::lora_elems::untile_bf16(&a, k), dtype),
                        _ => (a.clone(), dtype),
                    };
                    let row_bytes = plain.len() / rank;
                    for isa in Isa::supported() {
                        let isa = CheckedIsa::at_most(isa);
                        for n in 1..=4 {
                            let x: Vec<&[f32]> = xs[..n].iter().map(Vec::as_slice).collect();
                            let mut got = vec![0.0f32; rank * n];
                            shrink(isa, dtype, &a, rank, &x, &mut got);
                            let mut want = vec![0.0f32; rank * n];
                            let (d, w) = (plain_dtype, &plain[..]);
                            match x.as_slice() {
                                [x0] => dot_float::<1>(isa, d, w, row_bytes, &[x0], &mut want),
                                [x0, x1] => {
                                    dot_float::<2>(isa, d, w, row_bytes, &[x0, x1], &mut want)
                                }
                                [x0, x1, x2] => {
                                    dot_float::<3>(isa, d, w, row_bytes, &[x0, x1, x2], &mut want)
                                }
                                [x0, x1, x2, x3] => dot_float::<4>(
                                    isa,
                                    d,
                                    w,
                                    row_bytes,
                                    &[x0, x1, x2, x3],
                                    &mut want,
                                ),
                                _ => unreachable!(),
                            }
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{isa:?} {dtype} k {k} rank {rank} rows {n}"
                            );
                        }
                    }
                }
            }
        }
    }
}
