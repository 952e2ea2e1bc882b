//! AVX-512 kernels of `blocked`: `M` queries in registers against a key
//! block's rows (scores) or value rows (weighted sums).
//!
//! # Safety
//! Callers have AVX-512 F (and BF16 for the `_bf16` kernels) and pass
//! pointers valid for the reads and writes each kernel names.

use std::arch::x86_64::*;

use super::shape::{CHAINS_BF16, CHAINS_F32, COLUMN};
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};

/// A chain kernel's arguments: the first query's elements (the next
/// query's `stride` on), `steps` elements each; the chain's first key row
/// (of tile 0; tile 1's is `second` on); the output rows.
pub(super) type ChainArgs<T> = (*const T, usize, usize, *const T, usize, *mut f32);

/// A value kernel's arguments: the `M` rows of weights (`KEY_BLOCK`
/// floats or `KEY_BLOCK / 2` pairs each), the block's value rows
/// (`head_dim` each), the `M` outputs (`head_dim` apart), `head_dim`, the
/// first dimension of the column.
pub(super) type ValueArgs<T> = (*const T, *const T, *mut f32, usize, usize);

/// `to[g · KEY_BLOCK + j]` = the chain of fused multiply-adds from 0 of
/// query `g`'s `steps` elements against key `j`'s dimensions of the
/// chain: two accumulators per query, one per key tile.
///
/// # Safety
/// See the module; query `g` reads `q[g · stride .. g · stride + steps]`,
/// the keys rows `i · CHAINS_F32 · KEY_TILE` (and `second` on) for
/// `i < steps`, sixteen floats each; `to` takes `M · KEY_BLOCK` floats.
// Index loops over constant bounds: fully unrolled, every accumulator
// a register.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn chain_f32<const M: usize>(args: ChainArgs<f32>) {
    let (q, stride, steps, keys, second, to) = args;
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    for i in 0..steps {
        let at = i * CHAINS_F32 * KEY_TILE;
        // SAFETY: key rows and query elements inside the caller's ranges.
        unsafe {
            let a = _mm512_loadu_ps(keys.add(at));
            let b = _mm512_loadu_ps(keys.add(second + at));
            for g in 0..M {
                let qv = _mm512_set1_ps(*q.add(g * stride + i));
                acc[g][0] = _mm512_fmadd_ps(qv, a, acc[g][0]);
                acc[g][1] = _mm512_fmadd_ps(qv, b, acc[g][1]);
            }
        }
    }
    for g in 0..M {
        // SAFETY: `to` holds M rows of KEY_BLOCK.
        unsafe {
            _mm512_storeu_ps(to.add(g * KEY_BLOCK), acc[g][0]);
            _mm512_storeu_ps(to.add(g * KEY_BLOCK + KEY_TILE), acc[g][1]);
        }
    }
}

fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// [`chain_f32`] on BF16 pairs with `vdpbf16ps`; key rows `CHAINS_BF16`
/// pair rows apart.
///
/// # Safety
/// As [`chain_f32`], on `u32` pairs.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn chain_bf16<const M: usize>(args: ChainArgs<u32>) {
    let (q, stride, steps, keys, second, to) = args;
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    for i in 0..steps {
        let at = i * CHAINS_BF16 * KEY_TILE;
        // SAFETY: key rows and query pairs inside the caller's ranges.
        unsafe {
            let a = bh(_mm512_loadu_si512(keys.add(at).cast()));
            let b = bh(_mm512_loadu_si512(keys.add(second + at).cast()));
            for g in 0..M {
                let qv = bh(_mm512_set1_epi32(*q.add(g * stride + i) as i32));
                acc[g][0] = _mm512_dpbf16_ps(acc[g][0], qv, a);
                acc[g][1] = _mm512_dpbf16_ps(acc[g][1], qv, b);
            }
        }
    }
    for g in 0..M {
        // SAFETY: `to` holds M rows of KEY_BLOCK.
        unsafe {
            _mm512_storeu_ps(to.add(g * KEY_BLOCK), acc[g][0]);
            _mm512_storeu_ps(to.add(g * KEY_BLOCK + KEY_TILE), acc[g][1]);
        }
    }
}

/// The lanes of the column's vector `k` below `head_dim`.
fn mask(head_dim: usize, at: usize) -> __mmask16 {
    ((1u32 << head_dim.saturating_sub(at).min(16)) - 1) as __mmask16
}

/// `M` outputs' column `c0 .. c0 + COLUMN` (masked at `head_dim`) plus
/// the weighted sum of the block's `KEY_BLOCK` value rows: each element
/// one chain of fused multiply-adds in row order from its running value.
///
/// # Safety
/// See the module; `p` holds `M · KEY_BLOCK` floats, `values`
/// `KEY_BLOCK · head_dim`, the outputs `M · head_dim`.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_f32<const M: usize>(args: ValueArgs<f32>) {
    let (p, values, acc, head_dim, c0) = args;
    const K: usize = COLUMN / 16;
    let m: [__mmask16; K] = std::array::from_fn(|k| mask(head_dim, c0 + 16 * k));
    let mut sum = [[_mm512_setzero_ps(); K]; M];
    // Wrapping offsets: a masked-off lane's address is formed, never read.
    for g in 0..M {
        let out = acc.wrapping_add(g * head_dim + c0);
        for k in 0..K {
            // SAFETY: masked loads inside output g's row.
            sum[g][k] = unsafe { _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k)) };
        }
    }
    for j in 0..KEY_BLOCK {
        let v = values.wrapping_add(j * head_dim + c0);
        // SAFETY: masked loads inside value row j.
        let row: [__m512; K] =
            std::array::from_fn(|k| unsafe { _mm512_maskz_loadu_ps(m[k], v.wrapping_add(16 * k)) });
        for g in 0..M {
            // SAFETY: weight j of row g.
            let w = _mm512_set1_ps(unsafe { *p.add(g * KEY_BLOCK + j) });
            for k in 0..K {
                sum[g][k] = _mm512_fmadd_ps(w, row[k], sum[g][k]);
            }
        }
    }
    for g in 0..M {
        let out = acc.wrapping_add(g * head_dim + c0);
        for k in 0..K {
            // SAFETY: masked stores inside output g's row.
            unsafe { _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[g][k]) };
        }
    }
}

/// [`weighted_f32`] on BF16 pairs: `KEY_BLOCK / 2` rows of value pairs,
/// one `vdpbf16ps` per row and vector.
///
/// # Safety
/// As [`weighted_f32`], with `M · KEY_BLOCK / 2` weight pairs and
/// `KEY_BLOCK / 2 · head_dim` value pairs.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn weighted_bf16<const M: usize>(args: ValueArgs<u32>) {
    let (p, values, acc, head_dim, c0) = args;
    const K: usize = COLUMN / 16;
    const ROWS: usize = KEY_BLOCK / 2;
    let m: [__mmask16; K] = std::array::from_fn(|k| mask(head_dim, c0 + 16 * k));
    let mut sum = [[_mm512_setzero_ps(); K]; M];
    for g in 0..M {
        let out = acc.wrapping_add(g * head_dim + c0);
        for k in 0..K {
            // SAFETY: masked loads inside output g's row.
            sum[g][k] = unsafe { _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k)) };
        }
    }
    for r in 0..ROWS {
        let v = values.wrapping_add(r * head_dim + c0);
        // SAFETY: masked loads inside value row r.
        let row: [__m512bh; K] = std::array::from_fn(|k| {
            bh(unsafe { _mm512_maskz_loadu_epi32(m[k], v.wrapping_add(16 * k).cast()) })
        });
        for g in 0..M {
            // SAFETY: pair r of row g.
            let w = bh(_mm512_set1_epi32(unsafe { *p.add(g * ROWS + r) } as i32));
            for k in 0..K {
                sum[g][k] = _mm512_dpbf16_ps(sum[g][k], w, row[k]);
            }
        }
    }
    for g in 0..M {
        let out = acc.wrapping_add(g * head_dim + c0);
        for k in 0..K {
            // SAFETY: masked stores inside output g's row.
            unsafe { _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[g][k]) };
        }
    }
}
