//! One key block of a prompt's AMX walk (`blocked_span`) packed to BF16
//! pairs as the span kernels read them: its two key tiles, then its 32
//! values in pair rows of positions, each [`block_pairs`] long (split in
//! `[hi | lo | hi]` sections under `bf16x3`). The caller gives the place:
//! a tile's own span (`blocked_span::Span`) or a call's blocks shared by
//! all its tiles (`span_share`). A block packs the same bits wherever it
//! goes, so a tile's results do not depend on which of the two it reads.

use super::bf16::{self, Bf16Isa};
use super::bf16x3::{self, Rows};
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_elem::{Direct, KvElem};
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};

/// Pairs one block's keys pack to under `b`, and as many its values.
pub(super) fn block_pairs(b: Bf16Isa, head_dim: usize) -> usize {
    bf16x3::terms(b) * KEY_BLOCK * head_dim / 2
}

/// Where one block packs: [`block_pairs`] each.
pub(super) struct BlockOut<'a> {
    pub(super) keys: &'a mut [u32],
    pub(super) values: &'a mut [u32],
}

/// Buffers [`pack_run`] widens a block into, reused across blocks.
#[derive(Default)]
pub(super) struct Widened {
    /// The run as f32 (narrower caches only).
    pub(super) run: Vec<f32>,
    /// The values of a block that ends past the rows written, those
    /// positions as 0.
    tail: Vec<f32>,
}

/// Packs the key block `run` of a cache (two key tiles, then 32 value
/// rows, as stored) of which the first `written` positions hold this
/// walk's keys and values: the positions from `written` on (not written
/// yet, or an older turn of a ring) get values 0, so that their zero
/// weights meet finite values. Straight from an F16 run where it can.
pub(super) fn pack_run<E: KvElem>(
    isa: CheckedIsa,
    b: Bf16Isa,
    head_dim: usize,
    (run, written): (&[E], usize),
    scratch: &mut Widened,
    out: BlockOut<'_>,
) {
    let out = match (written >= KEY_BLOCK, E::direct(run)) {
        (true, Some(Direct::F16(f16))) => match pack_f16(b, head_dim, f16, out) {
            Ok(()) => return,
            Err(out) => out,
        },
        _ => out,
    };
    let (keys, values) = E::widen(isa, run, &mut scratch.run).split_at(KEY_BLOCK * head_dim);
    if written >= KEY_BLOCK {
        pack_f32(b, head_dim, keys, values, out);
        return;
    }
    scratch.tail.clear();
    scratch.tail.extend_from_slice(values);
    scratch.tail[written * head_dim..].fill(0.0);
    pack_f32(b, head_dim, keys, &scratch.tail, out);
}

/// A whole key block: `keys` two key tiles dimension-major, `values` 32
/// rows of `head_dim`.
pub(super) fn pack_f32(
    b: Bf16Isa,
    head_dim: usize,
    keys: &[f32],
    values: &[f32],
    out: BlockOut<'_>,
) {
    let len = KEY_BLOCK * head_dim;
    if b.split() {
        let (k, v) = (&keys[..len], &values[..len]);
        pack_split(b, head_dim, Rows::F32(k), Rows::F32(v), out);
        return;
    }
    let tile = head_dim / 2 * KEY_TILE;
    for (t, to) in out.keys[..2 * tile].chunks_exact_mut(tile).enumerate() {
        let from = &keys[t * KEY_TILE * head_dim..(t + 1) * KEY_TILE * head_dim];
        bf16::pack_key_tile(b, from, head_dim, to);
    }
    for (m, to) in out.values[..len / 2].chunks_exact_mut(head_dim).enumerate() {
        let even = &values[2 * m * head_dim..(2 * m + 1) * head_dim];
        let odd = &values[(2 * m + 1) * head_dim..(2 * m + 2) * head_dim];
        bf16::pack(b, even, odd, to);
    }
}

/// [`pack_f32`] straight from an F16 cache's run: each element widened
/// and rounded to BF16 in registers, the same bits as widening the run to
/// f32 and packing that, without the f32 copy. `out` back, nothing
/// written, where the AVX-512 kernel does not run.
pub(super) fn pack_f16<'o>(
    b: Bf16Isa,
    head_dim: usize,
    run: &[half::f16],
    out: BlockOut<'o>,
) -> Result<(), BlockOut<'o>> {
    let len = KEY_BLOCK * head_dim;
    if !b.simd() || !head_dim.is_multiple_of(16) || run.len() < 2 * len {
        return Err(out);
    }
    if b.split() {
        let (k, v) = (&run[..len], &run[len..2 * len]);
        pack_split(b, head_dim, Rows::F16(k), Rows::F16(v), out);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `simd` is set only where AVX-512 BF16 (with F and BW) was
    // detected (the caller checked it); each call reads `len` elements of
    // the run and writes `len / 2` pairs, in rows of 16 (key tiles) or
    // `head_dim` (a multiple of 16).
    unsafe {
        x86::pack_f16_rows(&run[..len], KEY_TILE, &mut out.keys[..len / 2]);
        x86::pack_f16_rows(&run[len..2 * len], head_dim, &mut out.values[..len / 2]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (run, out);
    Ok(())
}

/// A block of split operands (`bf16x3`): each key tile and the block's
/// values in three sections (`bf16x3::pack_rows`).
fn pack_split(b: Bf16Isa, head_dim: usize, keys: Rows<'_>, values: Rows<'_>, out: BlockOut<'_>) {
    let len = KEY_BLOCK * head_dim;
    let block = bf16x3::TERMS * len / 2;
    let tile = block / 2;
    for (t, to) in out.keys[..block].chunks_exact_mut(tile).enumerate() {
        let (s, e) = (t * len / 2, (t + 1) * len / 2);
        let from = match keys {
            Rows::F32(k) => Rows::F32(&k[s..e]),
            Rows::F16(k) => Rows::F16(&k[s..e]),
        };
        bf16x3::pack_rows(b, from, KEY_TILE, to);
    }
    bf16x3::pack_rows(b, values, head_dim, &mut out.values[..block]);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows `2m` and `2m + 1` of `src` (rows of `row` F16 values, `row` a
    /// multiple of 16) as BF16 pairs, row `m` of `dst`: pair `i` is
    /// `src[2m][i] | src[2m + 1][i] << 16`. As `bf16::pack` of the rows
    /// widened (`vcvtph2ps` is exact, `vcvtne2ps2bf16` rounds as
    /// `bf16::round`).
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16; `dst.len() == src.len() / 2`, both whole
    /// pairs of rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_f16_rows(src: &[half::f16], row: usize, dst: &mut [u32]) {
        // Word 2j of the result is word j (even[j]), word 2j + 1 is word
        // 16 + j (odd[j]).
        let order: [i16; 32] = std::array::from_fn(|w| ((w % 2) * 16 + w / 2) as i16);
        // SAFETY: 64 bytes from a 64-byte array.
        let order = unsafe { _mm512_loadu_si512(order.as_ptr().cast()) };
        let s = src.as_ptr().cast::<u16>();
        for m in 0..src.len() / (2 * row) {
            for i in (0..row).step_by(16) {
                // SAFETY: elements 2m·row + i and (2m + 1)·row + i, 16 each,
                // are inside `src`, pairs m·row + i.. inside `dst`.
                unsafe {
                    let e = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(2 * m * row + i).cast()));
                    let o =
                        _mm512_cvtph_ps(_mm256_loadu_si256(s.add((2 * m + 1) * row + i).cast()));
                    let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(o, e));
                    let pairs = _mm512_permutexvar_epi16(order, halves);
                    _mm512_storeu_si512(dst.as_mut_ptr().add(m * row + i).cast(), pairs);
                }
            }
        }
    }
}
