//! The expand half of a LoRA update, `acc += Σⱼ p[j] · values[j]`, over
//! the `rank` rows of an adapter's `Bᵀ` stored as F32 or tiled BF16
//! bytes (see `lora_elems`), widened to f32 in registers: a BF16 adapter
//! is read at half the bytes, and the arithmetic stays f32 (one fused
//! multiply-add per term, in order), so every ISA gives the scalar loop's
//! bits. (Q8_0 adapters take `lora_q8`'s integer kernels.)

use super::isa::{CheckedIsa, Isa};
use super::lora_elems::{tail_start, Elems, TILE};
use crate::DType;
use scalar::expand_scalar;
/// Whether the LoRA kernels read values of `dtype` (Q8_0: `lora_q8`).
pub(crate) fn expands(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::Q8_0)
}

/// `acc += Σⱼ p[j] · row j of values`, each row `acc.len()` elements of
/// `dtype` (F32, or BF16 tiled, which needs exactly `p.len()` rows).
/// Rows past the end of
/// `values`, every row of a type it does not read, and tiled rows of
/// another count are not read.
pub(crate) fn expand(isa: CheckedIsa, dtype: DType, p: &[f32], values: &[u8], acc: &mut [f32]) {
    let width = acc.len();
    let (Some(elems), Some(row_bytes)) = (Elems::of(dtype), dtype.bytes_for(width)) else {
        return;
    };
    let rows = p.len().min(values.len() / row_bytes.max(1));
    let (p, values) = (&p[..rows], &values[..rows * row_bytes]);
    // A tiled or interleaved matrix's layout depends on its row count.
    if elems == Elems::Bf16Tiles && values.len() != p.len() * row_bytes {
        return;
    }
    if elems == Elems::Bf16Tiles {
        // The tiles, then the tail: a plain BF16 matrix of the last
        // `width % 32` columns.
        let whole = width / TILE * TILE;
        let (tiles, tail) = values.split_at(tail_start(rows, width));
        let (acc_tiles, acc_tail) = acc.split_at_mut(whole);
        expand_tiles(isa, p, tiles, acc_tiles);
        return expand_rows(isa, Elems::Bf16, p, tail, acc_tail);
    }
    expand_rows(isa, elems, p, values, acc);
}

/// [`expand`] on rows stored one after another (not tiled).
fn expand_rows(isa: CheckedIsa, elems: Elems, p: &[f32], values: &[u8], acc: &mut [f32]) {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees the features; `values` holds
        // `p.len()` rows of `acc.len()` elements (cut in `expand`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::expand_avx512(elems, p, values, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::expand_avx2(elems, p, values, acc) },
        _ => expand_scalar(elems, p, values, acc, 0),
    }
}

/// [`expand`] on the whole tiles of a tiled BF16 matrix: `acc` is a
/// whole number of tiles wide, `values` holds `p.len()` rows of them.
fn expand_tiles(isa: CheckedIsa, p: &[f32], values: &[u8], acc: &mut [f32]) {
    match isa.get() {
        // SAFETY: as in `expand_rows`; `expand` cut `values` to the
        // tiles of `p.len()` rows of `acc.len()` columns.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::expand_tiles_avx512(p, values, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::expand_tiles_avx2(p, values, acc) },
        _ => expand_scalar(Elems::Bf16Tiles, p, values, acc, 0),
    }
}

/// The scalar loop, in its own module so that the x86 kernels (which end
/// each row with it) and their parent both reach it without a cycle.
mod scalar {
    use crate::cpu::lora_elems::{tiled_offset, Elems};
    use crate::formats::blocks::{bf16_at, f32_at};

    /// Column `c` of row `j` of `rows` rows `width` columns wide.
    #[inline]
    pub(super) fn value(
        elems: Elems,
        values: &[u8],
        (rows, width): (usize, usize),
        j: usize,
        c: usize,
    ) -> f32 {
        match elems {
            Elems::F32 => f32_at(values, 4 * (j * width + c)),
            Elems::Bf16 => bf16_at(values, 2 * (j * width + c)),
            Elems::Bf16Tiles => bf16_at(values, tiled_offset(rows, width, j, c)),
        }
    }

    /// The scalar loop for columns `from..` of each row (the SIMD kernels'
    /// tail takes it too, so a row's bits do not depend on where it ends).
    pub(super) fn expand_scalar(
        elems: Elems,
        p: &[f32],
        values: &[u8],
        acc: &mut [f32],
        from: usize,
    ) {
        let shape = (p.len(), acc.len());
        for (c, a) in acc.iter_mut().enumerate().skip(from) {
            for (j, p) in p.iter().enumerate() {
                *a = p.mul_add(value(elems, values, shape, j, c), *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers pass `values` of `p.len()` rows of `acc.len()` elements
    //! (two bytes each for BF16, four for F32; tiled as `lora_elems` says
    //! for the `_tiles` kernels) and have the named features.
    use std::arch::x86_64::*;

    use crate::cpu::lora_elems::{Elems, TILE};

    /// Two tiles at a time (four registers of sixteen columns, four chains
    /// of fused multiply-adds), or the last one alone: each 64-byte tile
    /// widens to its 32 columns with one shift and one AND.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub(super) unsafe fn expand_tiles_avx512(p: &[f32], values: &[u8], acc: &mut [f32]) {
        let (rank, width) = (p.len(), acc.len());
        let high = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
        let v = values.as_ptr();
        let mut c = 0;
        while c < width {
            let tiles = if c + 2 * TILE <= width { 2 } else { 1 };
            let out = acc.as_mut_ptr().add(c);
            // Tile (b, j) is at 64 · (b · rank + j).
            let first = v.add(64 * (c / TILE) * rank);
            let mut sum = [_mm512_setzero_ps(); 4];
            for (k, s) in sum.iter_mut().enumerate().take(2 * tiles) {
                *s = _mm512_loadu_ps(out.add(16 * k));
            }
            for (j, p) in p.iter().enumerate() {
                let p = _mm512_set1_ps(*p);
                for t in 0..tiles {
                    let w = _mm512_loadu_si512(first.add(64 * (t * rank + j)).cast());
                    let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w));
                    let hi = _mm512_castsi512_ps(_mm512_and_si512(w, high));
                    sum[2 * t] = _mm512_fmadd_ps(p, lo, sum[2 * t]);
                    sum[2 * t + 1] = _mm512_fmadd_ps(p, hi, sum[2 * t + 1]);
                }
            }
            for (k, s) in sum.iter().enumerate().take(2 * tiles) {
                _mm512_storeu_ps(out.add(16 * k), *s);
            }
            c += tiles * TILE;
        }
    }

    /// [`expand_tiles_avx512`] in eight-lane registers, one tile (four
    /// registers) at a time: columns 0-7 and 8-15 are the low halves of
    /// words 0-7 and 8-15, columns 16-23 and 24-31 their high halves.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn expand_tiles_avx2(p: &[f32], values: &[u8], acc: &mut [f32]) {
        let (rank, width) = (p.len(), acc.len());
        let high = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
        let v = values.as_ptr();
        let mut c = 0;
        while c < width {
            let out = acc.as_mut_ptr().add(c);
            let first = v.add(64 * (c / TILE) * rank);
            let mut sum = [_mm256_setzero_ps(); 4];
            for (k, s) in sum.iter_mut().enumerate() {
                *s = _mm256_loadu_ps(out.add(8 * k));
            }
            for (j, p) in p.iter().enumerate() {
                let p = _mm256_set1_ps(*p);
                let tile = first.add(64 * j);
                for half in 0..2 {
                    let w = _mm256_loadu_si256(tile.add(32 * half).cast());
                    let lo = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w));
                    let hi = _mm256_castsi256_ps(_mm256_and_si256(w, high));
                    sum[half] = _mm256_fmadd_ps(p, lo, sum[half]);
                    sum[2 + half] = _mm256_fmadd_ps(p, hi, sum[2 + half]);
                }
            }
            for (k, s) in sum.iter().enumerate() {
                _mm256_storeu_ps(out.add(8 * k), *s);
            }
            c += TILE;
        }
    }

    /// Sixteen elements of row `j` at `v` from element `c` (a multiple of
    /// 16), widened to f32: the masked-off lanes read nothing and are zero.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    #[inline]
    unsafe fn load16(
        elems: Elems,
        v: *const u8,
        (_, width): (usize, usize),
        j: usize,
        c: usize,
        mask: __mmask16,
    ) -> __m512 {
        match elems {
            // (A tiled matrix reaches the row kernels only as its tail,
            // rows in column order: `expand` splits it.)
            Elems::Bf16 | Elems::Bf16Tiles => {
                // Sixteen u16 lanes of a 512-bit masked load (BW's word
                // mask), widened to u32 and shifted up: the bits of the f32.
                let at = v.wrapping_add(2 * (j * width + c));
                let half = _mm512_maskz_loadu_epi16(mask as __mmask32, at.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm512_castsi512_si256(half),
                )))
            }
            Elems::F32 => _mm512_maskz_loadu_ps(mask, v.wrapping_add(4 * (j * width + c)).cast()),
        }
    }

    /// Sixty-four elements of `acc` at a time in four registers: four
    /// independent chains of fused multiply-adds (one chain would wait on
    /// the previous row's result at every row).
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub(super) unsafe fn expand_avx512(elems: Elems, p: &[f32], values: &[u8], acc: &mut [f32]) {
        let width = acc.len();
        let shape = (p.len(), width);
        let mask_at = |at: usize| -> __mmask16 {
            ((1u32 << width.saturating_sub(at).min(16)) - 1) as __mmask16
        };
        let v = values.as_ptr();
        let mut c = 0;
        while c < width {
            let m = [
                mask_at(c),
                mask_at(c + 16),
                mask_at(c + 32),
                mask_at(c + 48),
            ];
            let out = acc.as_mut_ptr().add(c);
            let mut sum = [_mm512_setzero_ps(); 4];
            for k in 0..4 {
                // A zero mask loads nothing (and cannot fault).
                sum[k] = _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k));
            }
            for (j, p) in p.iter().enumerate() {
                let p = _mm512_set1_ps(*p);
                for k in 0..4 {
                    // Past the row's end the offset is only formed, never
                    // read through (masked off).
                    let w = load16(elems, v, shape, j, c + 16 * k, m[k]);
                    sum[k] = _mm512_fmadd_ps(p, w, sum[k]);
                }
            }
            for k in 0..4 {
                _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[k]);
            }
            c += 64;
        }
    }

    /// Eight elements of row `j` at `v` from element `c` (a multiple of 8,
    /// inside the row), widened to f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(
        elems: Elems,
        v: *const u8,
        (_, width): (usize, usize),
        j: usize,
        c: usize,
    ) -> __m256 {
        match elems {
            // (As in `load16`: only a tiled matrix's tail comes here.)
            Elems::Bf16 | Elems::Bf16Tiles => {
                let half = _mm_loadu_si128(v.add(2 * (j * width + c)).cast());
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16))
            }
            Elems::F32 => _mm256_loadu_ps(v.add(4 * (j * width + c)).cast()),
        }
    }

    /// [`expand_avx512`] in eight-lane registers over the whole vectors of
    /// eight; the scalar loop takes the rest (same operations).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn expand_avx2(elems: Elems, p: &[f32], values: &[u8], acc: &mut [f32]) {
        let width = acc.len();
        let shape = (p.len(), width);
        let whole = width / 8 * 8;
        let v = values.as_ptr();
        let mut c = 0;
        while c < whole {
            let lanes = ((whole - c) / 8).min(4);
            let out = acc.as_mut_ptr().add(c);
            let mut sum = [_mm256_setzero_ps(); 4];
            for (k, s) in sum.iter_mut().enumerate().take(lanes) {
                *s = _mm256_loadu_ps(out.add(8 * k));
            }
            for (j, p) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(*p);
                for (k, s) in sum.iter_mut().enumerate().take(lanes) {
                    *s = _mm256_fmadd_ps(pv, load8(elems, v, shape, j, c + 8 * k), *s);
                }
            }
            for (k, s) in sum.iter().enumerate().take(lanes) {
                _mm256_storeu_ps(out.add(8 * k), *s);
            }
            c += 8 * lanes;
        }
        super::scalar::expand_scalar(elems, p, values, acc, whole);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `values` stored as the LoRA kernels read `dtype` (F32; BF16 rounded
    /// to nearest and tiled, as `lora_matrix` stores it), and the values
    /// that holds, widened back in element order.
    pub(crate) fn stored(dtype: DType, width: usize, values: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let bytes: Vec<u8> = match dtype {
            DType::BF16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        let row_bytes = dtype.bytes_for(width).expect("a width the type stores");
        let mut held = vec![0.0f32; values.len()];
        for (row, out) in bytes
            .chunks_exact(row_bytes)
            .zip(held.chunks_exact_mut(width))
        {
            crate::formats::dequantize_row(dtype, row, out).expect("a whole row");
        }
        let bytes = match dtype {
            DType::BF16 => crate::cpu::lora_elems::tile_bf16(&bytes, width),
            _ => bytes,
        };
        (bytes, held)
    }

    /// Every ISA gives the scalar loop's bits, for every type and widths
    /// that end inside a vector (of 8 and of 16) and inside a 64 chunk
    /// (Q8_0: whole blocks of 32), and the scalar loop is the plain sum of
    /// the values the bytes hold.
    #[test]
    fn every_isa_gives_the_scalar_bits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for width in [1usize, 7, 8, 13, 32, 64, 80, 96, 577, 576] {
            let rank = 5;
            let p: Vec<f32> = (0..rank).map(|_| rng.random_range(-1.0..1.0)).collect();
            let base: Vec<f32> = (0..width).map(|_| rng.random_range(-1.0..1.0)).collect();
            let values: Vec<f32> = (0..rank * width)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            for dtype in [DType::F32, DType::BF16] {
                let (bytes, held) = stored(dtype, width, &values);
                let elems = Elems::of(dtype).expect("a type the expand reads");
                let mut want = base.clone();
                expand_scalar(elems, &p, &bytes, &mut want, 0);
                for (c, w) in want.iter().enumerate() {
                    let mut a = base[c];
                    for (j, p) in p.iter().enumerate() {
                        a = p.mul_add(held[j * width + c], a);
                    }
                    assert_eq!(a.to_bits(), w.to_bits(), "{dtype} width {width}");
                }
                for isa in Isa::supported() {
                    let mut got = base.clone();
                    expand(CheckedIsa::at_most(isa), dtype, &p, &bytes, &mut got);
                    assert_eq!(got, want, "{isa:?} {dtype} width {width}");
                }
            }
        }
    }
}
