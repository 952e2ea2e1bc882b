//! The Q8_0 KV element type: keys and values quantized when written, as
//! llama.cpp's `-ctk q8_0 -ctv q8_0`, widened to f32 when read.
//!
//! # Numeric contract
//! Each position's key (and value) of one KV head is cut into groups of 32
//! consecutive dimensions; a group `x` is stored as (the rounding of
//! `quant_act`, the activations' Q8_0, which is ggml's vectorised
//! `quantize_row_q8_0` on x86 and ARM):
//! - `amax = max|x_i|`, `d = amax / 127` (f32), `id = 1/d` (0 when `d == 0`);
//! - `q_i = round_ties_even(x_i · id)` as i8 (|q_i| ≤ 127);
//! - the scale `f16(d)`, rounded to nearest even.
//!
//! Attention reads `q_i · f32(f16(d))`, one f32 multiply (exact: an 8-bit
//! integer times an 11-bit significand), and computes in f32 exactly as
//! over an F32 cache holding those values. A position's rounding depends
//! on its own key or value only, so decode (one position at a time) and a
//! prompt (many) store the same bytes. The NumPy reference
//! (`tests/python/reference/`) rounds K and V the same way.
//!
//! # Layout
//! One KV head's run of a block of 32 positions, `hd = head_dim` (a
//! multiple of 32, checked at cache creation: `KvType::check_head_dim`),
//! `G = hd / 32` groups, 68·hd bytes (34 per 32 elements):
//! - two key tiles of 16 positions, each `[hd][16]` int8 (dimension-major,
//!   as the f32 tiles) then `[G][16]` f16 scales: so one dimension row
//!   widens as 16 int8 → f32 times the group's vector of 16 scales;
//! - the 32 values, `[32][hd]` int8 (position-major), then `[32][G]` f16
//!   scales: one group widens as 32 int8 times one scale.
//!
//! Widening produces exactly the f32 layout of `kv_layout`, so the
//! attention kernels do not know the type.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::isa::CheckedIsa;
use super::kv_elem::KvElem;
use super::kv_layout::{KEY_BLOCK, KEY_TILE};
use super::quant_act::quantize_block_scalar;
#[cfg(target_arch = "x86_64")]
use super::Isa;
use crate::kv::{Q8_GROUP, Q8_GROUP_BYTES};

/// One byte of a Q8_0 run (an int8 quant or half of an f16 scale): a type
/// of its own so that a cache's bytes are not mistaken for values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub(crate) struct Q8Byte(pub(crate) u8);

/// Bytes of one key tile: `[hd][16]` int8 then `[G][16]` f16.
fn tile_bytes(hd: usize) -> usize {
    KEY_TILE * hd / Q8_GROUP * Q8_GROUP_BYTES
}

/// The head_dim of a run of `len` bytes (68 per dimension).
fn head_dim_of(len: usize) -> usize {
    len / (2 * KEY_BLOCK / Q8_GROUP * Q8_GROUP_BYTES)
}

impl KvElem for Q8Byte {
    fn run_len(head_dim: usize) -> usize {
        2 * KEY_BLOCK * head_dim / Q8_GROUP * Q8_GROUP_BYTES
    }

    fn store(run: &mut [Q8Byte], lane: usize, key: &[f32], value: &[f32]) {
        let run: &mut [u8] = bytemuck::cast_slice_mut(run);
        let hd = key.len();
        let groups = hd / Q8_GROUP;
        let mut q = [0i8; Q8_GROUP];
        // The key: dimension d of the tile's position j at `d * 16 + j`,
        // its group's scale at `16·hd + (g * 16 + j) * 2`.
        let (tile, j) = (lane / KEY_TILE, lane % KEY_TILE);
        let base = tile * tile_bytes(hd);
        for (g, x) in key.chunks_exact(Q8_GROUP).enumerate() {
            let d = quantize_block_scalar(x, &mut q).0;
            for (i, q) in q.iter().enumerate() {
                run[base + (g * Q8_GROUP + i) * KEY_TILE + j] = q.to_le_bytes()[0];
            }
            let at = base + KEY_TILE * hd + (g * KEY_TILE + j) * 2;
            run[at..at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
        // The value: its quants in a row, its scales after all 32 rows.
        let base = 2 * tile_bytes(hd);
        for (g, x) in value.chunks_exact(Q8_GROUP).enumerate() {
            let d = quantize_block_scalar(x, &mut q).0;
            let at = base + lane * hd + g * Q8_GROUP;
            run[at..at + Q8_GROUP].copy_from_slice(bytemuck::cast_slice(&q));
            let at = base + KEY_BLOCK * hd + (lane * groups + g) * 2;
            run[at..at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
    }

    fn widen<'a>(isa: CheckedIsa, src: &'a [Q8Byte], scratch: &'a mut Vec<f32>) -> &'a [f32] {
        let hd = head_dim_of(src.len());
        scratch.resize(2 * KEY_BLOCK * hd, 0.0);
        widen_q8(isa, bytemuck::cast_slice(src), hd, scratch);
        scratch
    }
}

/// Widens one run (`src`, 68·hd bytes) into `dst` (64·hd f32).
pub(crate) fn widen_q8(isa: CheckedIsa, src: &[u8], hd: usize, dst: &mut [f32]) {
    if hd == 0 || !hd.is_multiple_of(Q8_GROUP) {
        return;
    }
    let (keys, values) = src.split_at(2 * tile_bytes(hd));
    let (key_out, value_out) = dst.split_at_mut(KEY_BLOCK * hd);
    let tiles = keys
        .chunks_exact(tile_bytes(hd))
        .zip(key_out.chunks_exact_mut(KEY_TILE * hd));
    for (tile, out) in tiles {
        let (q, scales) = tile.split_at(KEY_TILE * hd);
        widen_tile(isa, q, scales, out);
    }
    let (q, scales) = values.split_at(KEY_BLOCK * hd);
    widen_groups(isa, q, scales, value_out);
}

/// A key tile on `isa`: see [`tile_scalar`].
fn widen_tile(isa: CheckedIsa, q: &[u8], scales: &[u8], out: &mut [f32]) {
    match isa.get() {
        // SAFETY: CheckedIsa guarantees the features (AVX2 implies F16C
        // here, see `Isa::is_supported`); the kernels take the lengths the
        // scalar twin does and stay within them.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::tile_avx512(q, scales, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::tile_avx2(q, scales, out) },
        _ => tile_scalar(q, scales, out),
    }
}

/// Groups in a row on `isa`: see [`groups_scalar`].
fn widen_groups(isa: CheckedIsa, q: &[u8], scales: &[u8], out: &mut [f32]) {
    match isa.get() {
        // SAFETY: as in `widen_tile`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { x86::groups_avx512(q, scales, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::groups_avx2(q, scales, out) },
        _ => groups_scalar(q, scales, out),
    }
}

/// Reading a stored scale: its own module, so that the vector kernels
/// below use it without using this module back.
mod scales {
    use half::f16;

    /// The f16 scale at index `i` of `scales`.
    pub(super) fn scale(scales: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]).to_f32()
    }
}
use scales::scale;

/// One key tile: `out[d * 16 + j] = q[d * 16 + j] · scale[(d / 32) * 16 + j]`.
fn tile_scalar(q: &[u8], scales: &[u8], out: &mut [f32]) {
    for (d, (row, out)) in q
        .chunks_exact(KEY_TILE)
        .zip(out.chunks_exact_mut(KEY_TILE))
        .enumerate()
    {
        let g = d / Q8_GROUP;
        for (j, (o, q)) in out.iter_mut().zip(row).enumerate() {
            *o = f32::from(*q as i8) * scale(scales, g * KEY_TILE + j);
        }
    }
}

/// Groups in a row (the values): `out[32k + i] = q[32k + i] · scale[k]`.
fn groups_scalar(q: &[u8], scales: &[u8], out: &mut [f32]) {
    let groups = q.chunks_exact(Q8_GROUP).zip(out.chunks_exact_mut(Q8_GROUP));
    for (k, (q, out)) in groups.enumerate() {
        let s = scale(scales, k);
        for (o, q) in out.iter_mut().zip(q) {
            *o = f32::from(*q as i8) * s;
        }
    }
}

/// `x` (whole groups of 32, one after another) as a Q8_0 cache reads it
/// back: what tests give an F32 cache to compare with a Q8_0 one.
#[cfg(test)]
pub(crate) fn round_q8(x: &[f32]) -> Vec<f32> {
    let mut q = [0i8; Q8_GROUP];
    x.chunks(Q8_GROUP)
        .flat_map(|g| {
            let d = quantize_block_scalar(g, &mut q).0;
            let s = f16::from_f32(d).to_f32();
            q.iter()
                .take(g.len())
                .map(|q| f32::from(*q) * s)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The scalar twins' arithmetic, vectorised: int8 → i32 → f32 (exact)
    //! times the f16 scale widened (exact), one f32 multiply per element.
    //!
    //! # Safety
    //! Callers have the named features and pass the lengths the scalar
    //! twins take: `q` and `out` of equal length (whole rows of 16 for a
    //! tile, whole groups of 32 for values), `scales` covering every group.
    use std::arch::x86_64::*;

    use super::scales::scale;
    use crate::cpu::kv_layout::KEY_TILE;
    use crate::kv::Q8_GROUP;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_avx512(q: &[u8], scales: &[u8], out: &mut [f32]) {
        let rows = q.len().min(out.len()) / KEY_TILE;
        let (q, s, o) = (q.as_ptr(), scales.as_ptr(), out.as_mut_ptr());
        for g in 0..rows.div_ceil(Q8_GROUP) {
            // SAFETY: group g's 16 scales lie in `scales` (the callers'
            // promise); row d's 16 quants and outputs in theirs.
            unsafe {
                let sv = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(g * 2 * KEY_TILE).cast()));
                for d in g * Q8_GROUP..((g + 1) * Q8_GROUP).min(rows) {
                    let qi = _mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(d * KEY_TILE).cast()));
                    let v = _mm512_mul_ps(_mm512_cvtepi32_ps(qi), sv);
                    _mm512_storeu_ps(o.add(d * KEY_TILE), v);
                }
            }
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn tile_avx2(q: &[u8], scales: &[u8], out: &mut [f32]) {
        let rows = q.len().min(out.len()) / KEY_TILE;
        let (q, s, o) = (q.as_ptr(), scales.as_ptr(), out.as_mut_ptr());
        for g in 0..rows.div_ceil(Q8_GROUP) {
            // SAFETY: as in `tile_avx512`, in halves of 8.
            unsafe {
                let at = s.add(g * 2 * KEY_TILE);
                let lo = _mm256_cvtph_ps(_mm_loadu_si128(at.cast()));
                let hi = _mm256_cvtph_ps(_mm_loadu_si128(at.add(16).cast()));
                for d in g * Q8_GROUP..((g + 1) * Q8_GROUP).min(rows) {
                    let (qd, od) = (q.add(d * KEY_TILE), o.add(d * KEY_TILE));
                    let ql = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qd.cast()));
                    let qh = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qd.add(8).cast()));
                    _mm256_storeu_ps(od, _mm256_mul_ps(_mm256_cvtepi32_ps(ql), lo));
                    _mm256_storeu_ps(od.add(8), _mm256_mul_ps(_mm256_cvtepi32_ps(qh), hi));
                }
            }
        }
    }

    /// Sixteen groups at a time, their scales widened with one `vcvtph2ps`
    /// (the scalar `scale` per group costs as much as the group itself),
    /// the rest one by one.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn groups_avx512(q: &[u8], scales: &[u8], out: &mut [f32]) {
        let groups = (q.len().min(out.len()) / Q8_GROUP).min(scales.len() / 2);
        let whole = groups / 16 * 16;
        let (q, o) = (q.as_ptr(), out.as_mut_ptr());
        let mut widened = [0.0f32; 16];
        for k in 0..groups {
            let s = if k < whole {
                if k % 16 == 0 {
                    // SAFETY: k + 16 <= groups scales lie in `scales`.
                    let h = unsafe { _mm256_loadu_si256(scales.as_ptr().add(2 * k).cast()) };
                    // SAFETY: `widened` holds 16 f32.
                    unsafe { _mm512_storeu_ps(widened.as_mut_ptr(), _mm512_cvtph_ps(h)) };
                }
                widened[k % 16]
            } else {
                scale(scales, k)
            };
            let sv = _mm512_set1_ps(s);
            // SAFETY: group k's quants and outputs lie in the slices.
            unsafe {
                for half in [0, 16] {
                    let at = k * Q8_GROUP + half;
                    let qi = _mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(at).cast()));
                    _mm512_storeu_ps(o.add(at), _mm512_mul_ps(_mm512_cvtepi32_ps(qi), sv));
                }
            }
        }
    }

    /// As `groups_avx512`, eight scales at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn groups_avx2(q: &[u8], scales: &[u8], out: &mut [f32]) {
        let groups = (q.len().min(out.len()) / Q8_GROUP).min(scales.len() / 2);
        let whole = groups / 8 * 8;
        let (q, o) = (q.as_ptr(), out.as_mut_ptr());
        let mut widened = [0.0f32; 8];
        for k in 0..groups {
            let s = if k < whole {
                if k % 8 == 0 {
                    // SAFETY: k + 8 <= groups scales lie in `scales`.
                    let h = unsafe { _mm_loadu_si128(scales.as_ptr().add(2 * k).cast()) };
                    // SAFETY: `widened` holds 8 f32.
                    unsafe { _mm256_storeu_ps(widened.as_mut_ptr(), _mm256_cvtph_ps(h)) };
                }
                widened[k % 8]
            } else {
                scale(scales, k)
            };
            let sv = _mm256_set1_ps(s);
            // SAFETY: group k's quants and outputs lie in the slices.
            unsafe {
                for eighth in (0..Q8_GROUP).step_by(8) {
                    let at = k * Q8_GROUP + eighth;
                    let qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(at).cast()));
                    _mm256_storeu_ps(o.add(at), _mm256_mul_ps(_mm256_cvtepi32_ps(qi), sv));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kv_layout::{key_at, value_at};
    use crate::cpu::Isa;

    /// A deterministic spread of magnitudes (and a zero group).
    fn sample(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let x = (s % 20_000) as f32 / 10_000.0 - 1.0;
                if (i / Q8_GROUP) % 5 == 4 {
                    0.0
                } else {
                    x * (1 + i % 7) as f32
                }
            })
            .collect()
    }

    /// The contract by hand, one group: what attention must read back.
    fn rounded(x: &[f32]) -> Vec<f32> {
        x.chunks(Q8_GROUP)
            .flat_map(|g| {
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d == 0.0 { 0.0 } else { 1.0 / d };
                let s = f16::from_f32(d).to_f32();
                g.iter()
                    .map(move |v| f32::from((v * id).round_ties_even() as i8) * s)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A run with every position written, and the f32 run it must widen to.
    fn filled(hd: usize, seed: u32) -> (Vec<Q8Byte>, Vec<f32>) {
        let mut run = vec![Q8Byte::default(); Q8Byte::run_len(hd)];
        let mut want = vec![0.0; 2 * KEY_BLOCK * hd];
        for lane in 0..KEY_BLOCK {
            let key = sample(hd, seed + 2 * lane as u32);
            let value = sample(hd, seed + 2 * lane as u32 + 1);
            Q8Byte::store(&mut run, lane, &key, &value);
            for (d, k) in rounded(&key).into_iter().enumerate() {
                want[key_at(lane, hd) + d * KEY_TILE] = k;
            }
            let at = value_at(lane, hd);
            want[at..at + hd].copy_from_slice(&rounded(&value));
        }
        (run, want)
    }

    #[test]
    fn a_run_is_34_bytes_per_32_elements() {
        assert_eq!(Q8Byte::run_len(64), 2 * KEY_BLOCK * 64 / 32 * 34);
        assert_eq!(head_dim_of(Q8Byte::run_len(256)), 256);
    }

    #[test]
    fn stored_values_widen_to_the_contract_on_every_isa() {
        for hd in [32, 64, 128, 256] {
            let (run, want) = filled(hd, hd as u32);
            for isa in Isa::supported() {
                let mut scratch = Vec::new();
                let got = Q8Byte::widen(CheckedIsa::at_most(isa), &run, &mut scratch);
                // Bit for bit (−0.0 and 0.0 apart), against the scalar path
                // and the contract written out above.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "{isa}, head_dim {hd}");
            }
        }
    }

    #[test]
    fn the_kernels_match_their_scalar_twins_past_whole_vectors() {
        // 37 groups (the vector paths' tail past 32 or 16) and a tile of
        // 40 rows (a group of 8 after the first 32).
        let bytes: Vec<u8> = (0..40 * 32u32).map(|i| (i * 37 % 251) as u8).collect();
        let scales: Vec<u8> = (0..64u16)
            .flat_map(|i| f16::from_f32(0.01 * f32::from(i) - 0.2).to_le_bytes())
            .collect();
        let run = |isa, tile: bool| {
            let mut out = vec![0.0f32; if tile { 40 * 16 } else { 37 * 32 }];
            let q = &bytes[..out.len()];
            let isa = CheckedIsa::at_most(isa);
            if tile {
                widen_tile(isa, q, &scales, &mut out);
            } else {
                widen_groups(isa, q, &scales, &mut out);
            }
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        for isa in Isa::supported() {
            for tile in [true, false] {
                assert_eq!(run(isa, tile), run(Isa::Scalar, tile), "{isa} tile {tile}");
            }
        }
    }

    #[test]
    fn contract_by_hand() {
        // amax 127 → d = 1, scale 1.0: the quants are the values rounded
        // to nearest even; 2.5 → 2, -64.5 → -64, 0.49 → 0.
        let mut x = [0.0f32; 32];
        x[..4].copy_from_slice(&[127.0, -64.5, 0.49, 2.5]);
        let mut run = vec![Q8Byte::default(); Q8Byte::run_len(32)];
        Q8Byte::store(&mut run, 20, &x, &x);
        let mut scratch = Vec::new();
        let f = Q8Byte::widen(CheckedIsa::at_most(Isa::Scalar), &run, &mut scratch);
        let key: Vec<f32> = (0..4).map(|d| f[key_at(20, 32) + d * KEY_TILE]).collect();
        assert_eq!(key, [127.0, -64.0, 0.0, 2.0]);
        assert_eq!(
            f[value_at(20, 32)..value_at(20, 32) + 4],
            [127.0, -64.0, 0.0, 2.0]
        );
    }

    #[test]
    fn a_position_rounds_alone() {
        // The same key and value at lane 5, beside different neighbours,
        // widen to the same numbers.
        let (hd, lane) = (64, 5);
        let (key, value) = (sample(hd, 7), sample(hd, 8));
        let read = |seed: u32| {
            let (mut run, _) = filled(hd, seed);
            Q8Byte::store(&mut run, lane, &key, &value);
            let mut scratch = Vec::new();
            let f = Q8Byte::widen(CheckedIsa::at_most(Isa::Scalar), &run, &mut scratch);
            let k: Vec<f32> = (0..hd)
                .map(|d| f[key_at(lane, hd) + d * KEY_TILE])
                .collect();
            (k, f[value_at(lane, hd)..value_at(lane, hd) + hd].to_vec())
        };
        assert_eq!(read(100), read(900));
        assert_eq!(read(100), (rounded(&key), rounded(&value)));
    }
}
