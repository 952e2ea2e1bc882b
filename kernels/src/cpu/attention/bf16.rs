//! Attention's two products in BF16 (`--attention-precision bf16`):
//! queries·keys and probabilities·values with BF16 inputs and f32
//! accumulation, as GPU flash attention computes them, through AVX-512
//! BF16's `vdpbf16ps` (32 multiply-adds an instruction, where an f32 FMA
//! does 16), and a scalar twin that rounds the same way bit for bit.
//!
//! The numeric contract (the NumPy reference, tests/python/reference,
//! rounds the same quantities):
//! - each f32 input (query, key, value, probability) rounds to BF16 to
//!   nearest even ([`round`]); a result below BF16's smallest normal is a
//!   signed zero, a NaN a quiet NaN (`vcvtne2ps2bf16`'s rounding);
//! - inputs go in pairs (dimensions `2i, 2i+1` of a query and key,
//!   positions `2i, 2i+1` of probabilities and values) into one f32 lane:
//!   `acc += a₁·b₁` then `acc += a₀·b₀`, each addition rounded once (a
//!   product of two BF16 is exact in f32), a denormal sum flushed to zero
//!   ([`dot2`]; the order and roundings are the instruction's on Intel,
//!   checked against it in the tests below);
//! - a score is two chains over the pairs (even and odd pair index, each
//!   from 0), `(c₀ + c₁) · scale`; an output element is one chain over
//!   the position pairs in order, starting from its running value;
//! - everything else (softmax, its running sum, merges) stays f32: the
//!   sum of a block's weights adds the f32 probabilities, not the rounded;
//! - one exception: on a CPU with AMX-BF16, a prompt chunk's rows (never a
//!   decode or speculative step's) take their products on AMX tiles
//!   (`blocked_amx`), the same BF16 inputs summed in the instruction's own
//!   order and rounding, within f32 rounding of the chains above
//!   (`SWITCHYARD_AMX=0` keeps the chains everywhere).

#[cfg(target_arch = "x86_64")]
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_layout::KEY_TILE;
#[cfg(target_arch = "x86_64")]
use crate::cpu::Isa;

/// Queries [`scores`] takes at once: two chains of two key tiles each,
/// sixteen accumulators for four queries, fit the 32 registers.
pub(super) const GROUP_MAX: usize = 4;

/// How attention multiplies (`--attention-precision`): f32 throughout,
/// or its two products in BF16 with f32 accumulation (`bf16`, which has
/// the numeric contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Products {
    F32,
    Bf16(Bf16Isa),
}

/// Whether the AVX-512 BF16 kernels run here, for a backend of `isa`: an
/// AVX-512 level (not capped below by `SWITCHYARD_ISA`) and the CPU's
/// AVX-512 BF16. Otherwise the scalar twins run (same results, slower).
/// Where the CPU also has AMX-BF16 (and Linux grants the tiles), `amx`
/// lets a long prompt chunk's tiles take their products on AMX tiles
/// (`blocked_amx`), which round the sums their own way (see there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bf16Isa {
    simd: bool,
    amx: bool,
    /// BF16 only where AMX takes a prompt chunk's rows, f32 for the rest
    /// (`AttentionPrecision::Bf16Prompt`; `blocked::for_rows` decides).
    prompt_only: bool,
    /// Each AMX operand split in a BF16 high and low part, three products
    /// summed (`AttentionPrecision::Bf16x3`; see `bf16x3`).
    split: bool,
}

impl Bf16Isa {
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn new(isa: CheckedIsa) -> Bf16Isa {
        let simd = isa.get() >= Isa::Avx512 && is_x86_feature_detected!("avx512bf16");
        let amx = simd && super::blocked_amx::available();
        Bf16Isa {
            simd,
            amx,
            prompt_only: false,
            split: false,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) fn new(_: crate::cpu::isa::CheckedIsa) -> Bf16Isa {
        Bf16Isa {
            simd: false,
            amx: false,
            prompt_only: false,
            split: false,
        }
    }

    /// The scalar twins only (tests compare them with the SIMD kernels).
    #[cfg(test)]
    pub(crate) fn scalar() -> Bf16Isa {
        Bf16Isa {
            simd: false,
            amx: false,
            prompt_only: false,
            split: false,
        }
    }

    /// Whether the AVX-512 BF16 kernels run.
    pub(crate) fn simd(self) -> bool {
        self.simd
    }

    /// Whether AMX tiles may take the blocked products (see `blocked`).
    pub(crate) fn amx(self) -> bool {
        self.amx
    }

    /// BF16 products only for the rows AMX takes (see `prompt_only`).
    pub(crate) fn for_prompts_only(self) -> Bf16Isa {
        Bf16Isa {
            prompt_only: true,
            ..self
        }
    }

    /// Whether only the rows AMX takes have BF16 products.
    pub(crate) fn prompt_only(self) -> bool {
        self.prompt_only
    }

    /// BF16 products only for the rows AMX takes, each operand split in
    /// two BF16 parts (see `bf16x3`); f32 for the rest.
    pub(crate) fn split_for_prompts(self) -> Bf16Isa {
        Bf16Isa {
            prompt_only: true,
            split: true,
            ..self
        }
    }

    /// Whether AMX's operands are split in two BF16 parts (`bf16x3`).
    pub(crate) fn split(self) -> bool {
        self.split
    }

    /// The same kernels without AMX: `vdpbf16ps`'s bits.
    pub(crate) fn without_amx(self) -> Bf16Isa {
        Bf16Isa { amx: false, ..self }
    }
}

/// `x` rounded to BF16 (the upper half of an f32), to nearest even; a
/// denormal or zero keeps only its sign; a NaN stays a (quiet) NaN.
#[inline]
pub(crate) fn round(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    if bits & 0x7f80_0000 == 0 {
        return (sign >> 16) as u16;
    }
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// A BF16 value as f32 (exact).
#[inline]
pub(super) fn widen(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x`, a denormal flushed to its signed zero.
#[inline]
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// One `vdpbf16ps` lane: `acc + a₁·b₁ + a₀·b₀` (`a = a₀ | a₁ << 16`),
/// in that order, each sum rounded once and flushed.
#[inline]
pub(crate) fn dot2(acc: f32, a: u32, b: u32) -> f32 {
    let (a0, a1) = (widen(a as u16), widen((a >> 16) as u16));
    let (b0, b1) = (widen(b as u16), widen((b >> 16) as u16));
    let acc = flush(a1.mul_add(b1, flush(acc)));
    flush(a0.mul_add(b0, acc))
}

/// `even[i]` and `odd[i]` rounded to BF16 into one pair, `dst[i]`; past
/// the shorter source, a missing element is 0.
pub(super) fn pack(isa: Bf16Isa, even: &[f32], odd: &[f32], dst: &mut [u32]) {
    let n = dst.len().min(even.len()).min(odd.len());
    let done = match isa.simd {
        // SAFETY: `simd` is set only where AVX-512 BF16 (and BW, with the
        // AVX-512 level) was detected; the kernel reads and writes `n`
        // elements of each slice.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { x86::pack(&even[..n], &odd[..n], &mut dst[..n]) },
        _ => 0,
    };
    for (i, d) in dst.iter_mut().enumerate().skip(done) {
        let e = even.get(i).map_or(0, |x| round(*x));
        let o = odd.get(i).map_or(0, |x| round(*x));
        *d = u32::from(e) | u32::from(o) << 16;
    }
}

/// `src` rounded to BF16 in order, two to a pair: pair `i` is `src[2i]`
/// and `src[2i + 1]` (a query's dimensions, a block's probabilities); past
/// `src`, 0.
pub(super) fn pack_in_order(isa: Bf16Isa, src: &[f32], dst: &mut [u32]) {
    let done = match isa.simd {
        // SAFETY: `simd` is set only where AVX-512 BF16 was detected; the
        // kernel stays inside both slices.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { x86::pack_in_order(src, dst) },
        _ => 0,
    };
    for (i, d) in dst.iter_mut().enumerate().skip(done) {
        let e = src.get(2 * i).map_or(0, |x| round(*x));
        let o = src.get(2 * i + 1).map_or(0, |x| round(*x));
        *d = u32::from(e) | u32::from(o) << 16;
    }
}

/// A key tile (sixteen keys dimension-major, dimension `d` of key `j` at
/// `d · KEY_TILE + j`) in pairs of dimensions: pair `p` of key `j` at
/// `p · KEY_TILE + j`.
pub(super) fn pack_key_tile(isa: Bf16Isa, tile: &[f32], head_dim: usize, dst: &mut [u32]) {
    // One call for the whole tile: a call of `pack` per pair row (sixteen
    // keys) cost more than its conversion.
    #[cfg(target_arch = "x86_64")]
    if isa.simd
        && head_dim.is_multiple_of(2)
        && tile.len() >= head_dim * KEY_TILE
        && dst.len() == head_dim / 2 * KEY_TILE
    {
        // SAFETY: `simd` is set only where AVX-512 BF16 (and BW) was
        // detected; the lengths were checked just above.
        unsafe { x86::pack_key_tile(tile, head_dim, dst) };
        return;
    }
    let row = |d: usize| -> &[f32] {
        if d < head_dim {
            &tile[d * KEY_TILE..(d + 1) * KEY_TILE]
        } else {
            &[]
        }
    };
    for (p, out) in dst.chunks_exact_mut(KEY_TILE).enumerate() {
        pack(isa, row(2 * p), row(2 * p + 1), out);
    }
}

/// `out[h][j] = scale · (q_h · key_j)` for the `qs.len() <= GROUP_MAX`
/// queries (pairs, as [`pack_in_order`]) and the two key tiles of a block
/// (`keys`: tile 0 then tile 1, each `pairs · KEY_TILE`, as
/// [`pack_key_tile`]).
pub(super) fn scores(
    isa: Bf16Isa,
    qs: &[&[u32]],
    keys: &[u32],
    scale: f32,
    out: &mut [[f32; 2 * KEY_TILE]],
) {
    let pairs = qs.first().map_or(0, |q| q.len());
    let fits = qs.len() <= GROUP_MAX
        && out.len() >= qs.len()
        && keys.len() >= 2 * pairs * KEY_TILE
        && qs.iter().all(|q| q.len() == pairs);
    match isa.simd {
        // SAFETY: `simd` is set only where AVX-512 BF16 was detected; the
        // lengths the kernel reads were checked just above.
        #[cfg(target_arch = "x86_64")]
        true if fits && pairs > 0 => unsafe {
            let keys = &keys[..2 * pairs * KEY_TILE];
            match qs.len() {
                1 => x86::scores::<1>(qs, keys, scale, out),
                2 => x86::scores::<2>(qs, keys, scale, out),
                3 => x86::scores::<3>(qs, keys, scale, out),
                _ => x86::scores::<4>(qs, keys, scale, out),
            }
        },
        _ => {
            for (q, out) in qs.iter().zip(out.iter_mut()) {
                scores_scalar(q, keys, scale, out);
            }
        }
    }
}

pub(super) fn scores_scalar(q: &[u32], keys: &[u32], scale: f32, out: &mut [f32; 2 * KEY_TILE]) {
    let pairs = q.len();
    for (j, out) in out.iter_mut().enumerate() {
        let tile = &keys[(j / KEY_TILE) * pairs * KEY_TILE..];
        let mut c = [0.0f32; 2];
        for (p, q) in q.iter().enumerate() {
            c[p % 2] = dot2(c[p % 2], *q, tile[p * KEY_TILE + j % KEY_TILE]);
        }
        *out = (c[0] + c[1]) * scale;
    }
}

/// `acc[h · width + d] += Σ_m p_h[m] · values[m · width + d]` in pairs: `ps`
/// (`ps.len() <= GROUP_MAX`, each `rows` pairs of probabilities) and
/// `values` (`rows` rows of `width` pairs of positions, as [`pack`] makes
/// them from two value rows); one chain per element, in row order.
pub(super) fn weighted_sum(isa: Bf16Isa, ps: &[&[u32]], values: &[u32], acc: &mut [f32]) {
    let g = ps.len();
    let width = acc.len().checked_div(g).unwrap_or(0);
    let rows = ps.first().map_or(0, |p| p.len());
    let fits = g <= GROUP_MAX
        && width > 0
        && ps.iter().all(|p| p.len() == rows)
        && values.len() >= rows * width;
    match isa.simd {
        // SAFETY: `simd` is set only where AVX-512 BF16 was detected; the
        // lengths were checked just above.
        #[cfg(target_arch = "x86_64")]
        true if fits => unsafe {
            let acc = &mut acc[..g * width];
            match g {
                1 => x86::weighted_sum::<1>(ps, values, acc, width),
                2 => x86::weighted_sum::<2>(ps, values, acc, width),
                3 => x86::weighted_sum::<3>(ps, values, acc, width),
                _ => x86::weighted_sum::<4>(ps, values, acc, width),
            }
        },
        _ => {
            for (p, acc) in ps.iter().zip(acc.chunks_exact_mut(width.max(1))) {
                for (d, a) in acc.iter_mut().enumerate() {
                    *a = p
                        .iter()
                        .enumerate()
                        .fold(*a, |a, (m, p)| dot2(a, *p, values[m * width + d]));
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Callers have AVX-512 F, BW and BF16 and pass the lengths named.
    use std::arch::x86_64::*;

    use crate::cpu::kv_layout::KEY_TILE;

    /// [`super::pack`] on the whole vectors of sixteen; returns how many
    /// elements it did. `vcvtne2ps2bf16` rounds as [`super::round`]
    /// (tested), then `vpermw` interleaves the two halves into pairs.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack(even: &[f32], odd: &[f32], dst: &mut [u32]) -> usize {
        let whole = dst.len() / 16 * 16;
        // Word 2j of the result is word j (even[j]), word 2j + 1 is word
        // 16 + j (odd[j]).
        let order: [i16; 32] = std::array::from_fn(|w| ((w % 2) * 16 + w / 2) as i16);
        // SAFETY: 64 bytes from a 64-byte array.
        let order = unsafe { _mm512_loadu_si512(order.as_ptr().cast()) };
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= len of all three slices (equal lengths).
            unsafe {
                let e = _mm512_loadu_ps(even.as_ptr().add(i));
                let o = _mm512_loadu_ps(odd.as_ptr().add(i));
                let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(o, e));
                let pairs = _mm512_permutexvar_epi16(order, halves);
                _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), pairs);
            }
        }
        whole
    }

    /// [`super::pack_key_tile`] of an even `head_dim`: pair row `p` is
    /// [`pack`] of rows `2p` and `2p + 1`.
    ///
    /// # Safety
    /// See the module; `tile` holds `head_dim · KEY_TILE` floats, `dst`
    /// `head_dim / 2 · KEY_TILE` pairs.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_key_tile(tile: &[f32], head_dim: usize, dst: &mut [u32]) {
        let order: [i16; 32] = std::array::from_fn(|w| ((w % 2) * 16 + w / 2) as i16);
        // SAFETY: 64 bytes from a 64-byte array.
        let order = unsafe { _mm512_loadu_si512(order.as_ptr().cast()) };
        for p in 0..head_dim / 2 {
            // SAFETY: rows 2p and 2p + 1 of `tile` and pair row p of `dst`
            // are inside them (the caller's lengths).
            unsafe {
                let e = _mm512_loadu_ps(tile.as_ptr().add(2 * p * KEY_TILE));
                let o = _mm512_loadu_ps(tile.as_ptr().add((2 * p + 1) * KEY_TILE));
                let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(o, e));
                let pairs = _mm512_permutexvar_epi16(order, halves);
                _mm512_storeu_si512(dst.as_mut_ptr().add(p * KEY_TILE).cast(), pairs);
            }
        }
    }

    /// [`super::pack_in_order`] on the whole vectors of 32 elements;
    /// returns how many pairs it did.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn pack_in_order(src: &[f32], dst: &mut [u32]) -> usize {
        let whole = (src.len() / 32).min(dst.len() / 16);
        for i in 0..whole {
            // SAFETY: 32 elements from 32·i of `src`, 16 pairs from 16·i of
            // `dst` (`whole` bounds both).
            unsafe {
                let lo = _mm512_loadu_ps(src.as_ptr().add(32 * i));
                let hi = _mm512_loadu_ps(src.as_ptr().add(32 * i + 16));
                let words: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(dst.as_mut_ptr().add(16 * i).cast(), words);
            }
        }
        16 * whole
    }

    fn bh(x: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain lanes.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
    }

    /// `G` queries of `pairs` pairs against two key tiles (`keys.len() ==
    /// 2 · pairs · KEY_TILE`): per query and tile two chains over the
    /// pairs (even, odd pair index), summed and scaled.
    ///
    /// # Safety
    /// See the module; `qs.len() == G`, each `pairs` long, `out.len() >= G`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn scores<const G: usize>(
        qs: &[&[u32]],
        keys: &[u32],
        scale: f32,
        out: &mut [[f32; 2 * KEY_TILE]],
    ) {
        let pairs = keys.len() / (2 * KEY_TILE);
        let q: [*const u32; G] = std::array::from_fn(|g| qs[g].as_ptr());
        let mut c = [[[_mm512_setzero_ps(); 2]; 2]; G];
        let t0 = keys.as_ptr();
        let t1 = t0.wrapping_add(pairs * KEY_TILE);
        // SAFETY (every load): p < pairs, inside every query and both tiles.
        let k0 = |p: usize| bh(unsafe { _mm512_loadu_si512(t0.add(p * KEY_TILE).cast()) });
        let k1 = |p: usize| bh(unsafe { _mm512_loadu_si512(t1.add(p * KEY_TILE).cast()) });
        let qp = |g: usize, p: usize| bh(unsafe { _mm512_set1_epi32(*q[g].add(p) as i32) });
        let twos = pairs / 2;
        for i in 0..twos {
            for ch in 0..2 {
                let p = 2 * i + ch;
                let (a, b) = (k0(p), k1(p));
                for g in 0..G {
                    let qv = qp(g, p);
                    c[g][0][ch] = _mm512_dpbf16_ps(c[g][0][ch], qv, a);
                    c[g][1][ch] = _mm512_dpbf16_ps(c[g][1][ch], qv, b);
                }
            }
        }
        if pairs % 2 == 1 {
            let p = pairs - 1;
            let (a, b) = (k0(p), k1(p));
            for g in 0..G {
                let qv = qp(g, p);
                c[g][0][0] = _mm512_dpbf16_ps(c[g][0][0], qv, a);
                c[g][1][0] = _mm512_dpbf16_ps(c[g][1][0], qv, b);
            }
        }
        let s = _mm512_set1_ps(scale);
        for g in 0..G {
            for t in 0..2 {
                let sum = _mm512_mul_ps(_mm512_add_ps(c[g][t][0], c[g][t][1]), s);
                // SAFETY: `out[g]` is 32 f32; tile t's sixteen at 16·t.
                unsafe { _mm512_storeu_ps(out[g].as_mut_ptr().add(t * KEY_TILE), sum) };
            }
        }
    }

    /// [`super::weighted_sum`]: sixty-four elements of each of `G` outputs
    /// at a time (sixteen accumulators), one `vdpbf16ps` per row and vector.
    ///
    /// # Safety
    /// See the module; `ps.len() == G`, each `rows` long, `values.len() >=
    /// rows · width`, `acc.len() == G · width`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn weighted_sum<const G: usize>(
        ps: &[&[u32]],
        values: &[u32],
        acc: &mut [f32],
        width: usize,
    ) {
        let rows = ps[0].len();
        let p: [*const u32; G] = std::array::from_fn(|h| ps[h].as_ptr());
        let mask_at = |at: usize| -> __mmask16 {
            ((1u32 << width.saturating_sub(at).min(16)) - 1) as __mmask16
        };
        let mut c = 0;
        while c < width {
            let m = [
                mask_at(c),
                mask_at(c + 16),
                mask_at(c + 32),
                mask_at(c + 48),
            ];
            let mut sum = [[_mm512_setzero_ps(); 4]; G];
            for h in 0..G {
                let out = acc.as_mut_ptr().wrapping_add(h * width + c);
                for k in 0..4 {
                    // SAFETY: a zero mask loads nothing (and cannot fault).
                    sum[h][k] = unsafe { _mm512_maskz_loadu_ps(m[k], out.wrapping_add(16 * k)) };
                }
            }
            // Wrapping offsets: past the last chunk the pointers are only
            // formed, never read through (masked off).
            let mut v = values.as_ptr().wrapping_add(c);
            for j in 0..rows {
                // SAFETY: masked loads inside row j (j < rows).
                let row = unsafe {
                    [
                        bh(_mm512_maskz_loadu_epi32(m[0], v.cast())),
                        bh(_mm512_maskz_loadu_epi32(m[1], v.wrapping_add(16).cast())),
                        bh(_mm512_maskz_loadu_epi32(m[2], v.wrapping_add(32).cast())),
                        bh(_mm512_maskz_loadu_epi32(m[3], v.wrapping_add(48).cast())),
                    ]
                };
                for h in 0..G {
                    // SAFETY: j < rows, inside every weight row.
                    let w = bh(_mm512_set1_epi32(unsafe { *p[h].add(j) } as i32));
                    for k in 0..4 {
                        sum[h][k] = _mm512_dpbf16_ps(sum[h][k], w, row[k]);
                    }
                }
                v = v.wrapping_add(width);
            }
            for h in 0..G {
                let out = acc.as_mut_ptr().wrapping_add(h * width + c);
                for k in 0..4 {
                    // SAFETY: masked stores inside output h's row.
                    unsafe { _mm512_mask_storeu_ps(out.wrapping_add(16 * k), m[k], sum[h][k]) };
                }
            }
            c += 64;
        }
    }
}

#[cfg(test)]
#[path = "bf16_tests.rs"]
mod tests;
