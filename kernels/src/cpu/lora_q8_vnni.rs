//! The AVX-512 VNNI kernels of `lora_q8`: the same integer sums and f32
//! operations as its scalar twins, in the same order, so the same bits.
//!
//! # Safety
//! Callers have AVX-512 F, BW, VNNI and F16C, and pass a packed matrix
//! of the shape `lora_q8::shrink` and `lora_q8::expand` check.

use std::arch::x86_64::*;

use super::lora_q8_operands::{QuantMid, QuantRow, QUAD, UNIT};
use crate::formats::blocks::QK;

/// Groups of four rank rows a shrink pass sums at once (16 rows: each
/// block of `x` is broadcast once for all of them).
const GROUPS_AT_ONCE: usize = 4;

/// The four f16 scales after a unit's quants, widened.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
unsafe fn scales(unit: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_loadl_epi64(unit.add(QUAD * QK).cast()))
}

/// `x` (whole blocks) into `row`'s quants, scales and sums (sized for
/// it): `quant_act`'s AVX-512 block quantizer, the same operations (so the
/// same bits on every ISA), a row at a time without the sums of halves
/// the matmul kernels need.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize(x: &[f32], row: &mut QuantRow) {
    for (b, x) in x.chunks_exact(QK).enumerate() {
        let v0 = _mm512_loadu_ps(x.as_ptr());
        let v1 = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
        let i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        let q = row.q.as_mut_ptr().add(QK * b);
        _mm_storeu_si128(q.cast(), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128(q.add(16).cast(), _mm512_cvtsepi32_epi8(i1));
        *row.d.get_unchecked_mut(b) = d;
        *row.sums.get_unchecked_mut(b) = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub(super) unsafe fn shrink(a: &[u8], rows: usize, x: &QuantRow, sums: &mut [f32]) {
    let (groups, blocks) = (rows / QUAD, x.d.len());
    // Lane l takes row l / 4's scale.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(GROUPS_AT_ONCE);
        let mut lanes = [_mm512_setzero_ps(); GROUPS_AT_ONCE];
        for b in 0..blocks {
            let xq = x.q.as_ptr().add(QK * b);
            // Every lane's four columns of each half: 16 bytes, four times.
            let x0 = _mm512_broadcast_i32x4(_mm_loadu_si128(xq.cast()));
            let x1 = _mm512_broadcast_i32x4(_mm_loadu_si128(xq.add(16).cast()));
            // The stored `q + 128`: each row's first lane takes -128 · Σq_x.
            let start = _mm512_maskz_set1_epi32(0x1111, -128 * x.sums[b]);
            let dx = _mm512_set1_ps(x.d[b]);
            for (gg, lane) in lanes.iter_mut().enumerate().take(n) {
                let unit = a.as_ptr().add(UNIT * (b * groups + g0 + gg));
                let mut sum = _mm512_dpbusd_epi32(start, _mm512_loadu_si512(unit.cast()), x0);
                sum = _mm512_dpbusd_epi32(sum, _mm512_loadu_si512(unit.add(64).cast()), x1);
                let d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales(unit)));
                *lane = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dx), *lane);
            }
        }
        for (gg, lane) in lanes.iter().enumerate().take(n) {
            let mut l = [0.0f32; 16];
            _mm512_storeu_ps(l.as_mut_ptr(), *lane);
            for t in 0..QUAD {
                let l = &l[4 * t..4 * t + 4];
                sums[QUAD * (g0 + gg) + t] = (l[0] + l[1]) + (l[2] + l[3]);
            }
        }
        g0 += n;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub(super) unsafe fn expand(p: &QuantMid, b_t: &[u8], acc: &mut [f32]) {
    let groups = p.words.len();
    for (b, block) in acc.chunks_exact_mut(QK).enumerate() {
        let out = block.as_mut_ptr();
        let mut o = [_mm512_loadu_ps(out), _mm512_loadu_ps(out.add(16))];
        for g in 0..groups {
            let unit = b_t.as_ptr().add(UNIT * (b * groups + g));
            let qp = _mm512_set1_epi32(*p.words.get_unchecked(g));
            let start = _mm512_set1_epi32(*p.offsets.get_unchecked(g));
            let s = _mm512_set1_ps(p.d * _mm_cvtss_f32(scales(unit)));
            for (h, o) in o.iter_mut().enumerate() {
                let sum =
                    _mm512_dpbusd_epi32(start, _mm512_loadu_si512(unit.add(64 * h).cast()), qp);
                *o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, *o);
            }
        }
        _mm512_storeu_ps(out, o[0]);
        _mm512_storeu_ps(out.add(16), o[1]);
    }
}
