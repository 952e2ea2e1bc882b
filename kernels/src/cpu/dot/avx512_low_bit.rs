//! AVX-512 (F + BW) dot products of Q2_K, Q3_K, Q5_K and IQ4_XS, 64
//! elements (two activation blocks, one zmm) per step. Compiled twice, as
//! `avx512`'s kernels are: `vnni` with `vpdpbusd`, `plain` emulating it
//! with `vpmaddubsw` + `vpmaddwd`, whose i16 pair sums saturate, so the
//! unsigned operand stays ≤ 128 here too (2-bit, 3-bit + 4 and 5-bit
//! quants; IQ4 values as `|v|` against activations carrying `v`'s sign).
//! IQ4_NL rows take the AVX2 kernel: on VNNI its matrices are repacked
//! (see `packed`), leaving only tail rows.
//!
//! The 16-element scales of Q2_K and Q3_K multiply the i32 lanes (four
//! elements each) exactly, as `avx512`'s Q6_K kernel does.
//!
//! # Safety
//! Every function needs the features its module's macro call names, and
//! the shape preconditions checked by `dot::dot_quantized` (spread
//! activation scales included).

/// Whether these kernels take `dtype`.
pub(crate) fn takes(dtype: crate::DType) -> bool {
    use crate::DType;
    matches!(dtype, DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS)
}

/// `vpdpbusd`, or its two-instruction emulation.
macro_rules! low_bit_dpbusd {
    (true, $acc:expr, $u:expr, $s:expr) => {
        _mm512_dpbusd_epi32($acc, $u, $s)
    };
    (false, $acc:expr, $u:expr, $s:expr) => {
        _mm512_add_epi32(
            $acc,
            _mm512_madd_epi16(_mm512_maddubs_epi16($u, $s), _mm512_set1_epi16(1)),
        )
    };
}

/// Expands to the kernels for one feature set.
macro_rules! avx512_low_bit_kernels {
    ($features:literal, vnni = $vnni:tt) => {
        use std::arch::x86_64::*;

        use crate::cpu::quant_act::QRow;
        use crate::formats::blocks::q4k_block_scales;
        use crate::formats::blocks::{f16_at, QK};
        use crate::formats::blocks::{iq4xs_scale, IQ4XS_QS, IQ4_VALUES};
        use crate::formats::blocks::{
            q3k_scale, Q2K_D, Q2K_DMIN, Q2K_QS, Q3K_D, Q3K_QS, Q3K_SCALES, Q5K_QH, Q5K_QS,
            Q5K_SCALES,
        };
        use crate::DType;

        /// `out[row · R + r] = W[row] · a[r]` for a type [`super::takes`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_quantized<const R: usize>(
            dtype: DType,
            w: &[u8],
            row_bytes: usize,
            a: &[QRow<'_>; R],
            out: &mut [f32],
        ) {
            let row: unsafe fn(&[u8], &[QRow<'_>; R], &mut [f32; R]) = match dtype {
                DType::Q2K => dot_q2k,
                DType::Q3K => dot_q3k,
                DType::Q5K => dot_q5k,
                DType::IQ4XS => dot_iq4xs,
                _ => |_, _, o| *o = [f32::NAN; R],
            };
            for (w, o) in w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0) {
                row(w, a, o);
            }
        }

        /// `acc + Σ u·s` over groups of four bytes (u8 × i8 → i32).
        #[target_feature(enable = $features)]
        #[inline]
        fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
            low_bit_dpbusd!($vnni, acc, u, s)
        }

        /// `[x0 ×8, x1 ×8]`: one value per activation block of a zmm.
        #[target_feature(enable = $features)]
        #[inline]
        fn halves_ps(x0: f32, x1: f32) -> __m512 {
            let x1 = _mm256_castps_pd(_mm256_set1_ps(x1));
            _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_set1_ps(x0)),
                x1,
                1,
            ))
        }

        /// `[x0 ×16 i16, x1 ×16 i16]`: a per-half shift count.
        #[target_feature(enable = $features)]
        #[inline]
        fn halves_epi16(x0: i16, x1: i16) -> __m512i {
            _mm512_inserti64x4(_mm512_set1_epi16(x0), _mm256_set1_epi16(x1), 1)
        }

        /// The 32 bytes at `p` in both halves of a zmm.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn both_halves(p: *const u8) -> __m512i {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()))
        }

        /// Activation blocks `b, b+1` (`b` even): their 64 quants, and
        /// their scales spread `[d_b ×8, d_b+1 ×8]`.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn act_pair(a: &QRow<'_>, b: usize) -> (__m512i, __m512) {
            (
                _mm512_loadu_si512(a.qs.as_ptr().add(b * QK).cast()),
                _mm512_loadu_ps(a.spread.as_ptr().add(16 * b)),
            )
        }

        /// Four consecutive 16-element scales `s[j..j+4]`, each over four
        /// i32 lanes.
        #[target_feature(enable = $features)]
        #[inline]
        fn scales_by_16(s: __m128i, j: usize) -> __m128i {
            let j = j as i8;
            let pick = _mm_setr_epi8(
                j,
                j,
                j,
                j,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 3,
                j + 3,
                j + 3,
                j + 3,
            );
            _mm_shuffle_epi8(s, pick)
        }

        #[target_feature(enable = $features)]
        unsafe fn dot_q2k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q2K.block_bytes();
            let zero = _mm512_setzero_si512();
            let ones = _mm512_set1_epi8(1);
            let three = _mm512_set1_epi8(3);
            let nibble = _mm512_set1_epi32(0x0F);
            let mut acc = [_mm512_setzero_ps(); R];
            for (i, block) in w.chunks_exact(bb).enumerate() {
                let d = _mm512_set1_ps(f16_at(block, Q2K_D));
                let dmin = _mm512_set1_ps(f16_at(block, Q2K_DMIN));
                let scale_min = _mm_loadu_si128(block.as_ptr().cast());
                for half in 0..2 {
                    let qs = both_halves(block.as_ptr().add(Q2K_QS + 32 * half));
                    for s in [0usize, 2] {
                        // Elements 128·half + 32s + l (low half of the zmm)
                        // and + 32 more (high half): bits 2s, 2s+2 of byte l.
                        let shift = halves_epi16(2 * s as i16, 2 * s as i16 + 2);
                        let q = _mm512_and_si512(_mm512_srlv_epi16(qs, shift), three);
                        let sm = _mm512_cvtepu8_epi32(scales_by_16(scale_min, 8 * half + 2 * s));
                        let sc = _mm512_and_si512(sm, nibble);
                        let m = _mm512_srli_epi32(sm, 4);
                        let b = 8 * i + 4 * half + s;
                        for r in 0..R {
                            let (act, da) = act_pair(&a[r], b);
                            let scaled = _mm512_mullo_epi32(dpbusd(zero, q, act), sc);
                            let mins = _mm512_mullo_epi32(dpbusd(zero, ones, act), m);
                            acc[r] = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(scaled),
                                _mm512_mul_ps(d, da),
                                acc[r],
                            );
                            acc[r] = _mm512_fnmadd_ps(
                                _mm512_cvtepi32_ps(mins),
                                _mm512_mul_ps(dmin, da),
                                acc[r],
                            );
                        }
                    }
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn dot_q3k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q3K.block_bytes();
            let zero = _mm512_setzero_si512();
            let one = _mm512_set1_epi8(1);
            let three = _mm512_set1_epi8(3);
            let four = _mm512_set1_epi8(4);
            let mut acc = [_mm512_setzero_ps(); R];
            for (i, block) in w.chunks_exact(bb).enumerate() {
                let d = _mm512_set1_ps(f16_at(block, Q3K_D));
                let packed = &block[Q3K_SCALES..Q3K_SCALES + 12];
                let scales: [i8; 16] = std::array::from_fn(|j| q3k_scale(packed, j));
                let scales = _mm_loadu_si128(scales.as_ptr().cast());
                // Bit k of byte l: element 32k + l's high bit.
                let hmask = both_halves(block.as_ptr());
                for half in 0..2 {
                    let qs = both_halves(block.as_ptr().add(Q3K_QS + 32 * half));
                    for s in [0usize, 2] {
                        let shift = halves_epi16(2 * s as i16, 2 * s as i16 + 2);
                        let low = _mm512_and_si512(_mm512_srlv_epi16(qs, shift), three);
                        let plane = (4 * half + s) as i16;
                        let high = _mm512_and_si512(
                            _mm512_srlv_epi16(hmask, halves_epi16(plane, plane + 1)),
                            one,
                        );
                        // q + 4 (0..8).
                        let q = _mm512_or_si512(low, _mm512_slli_epi16(high, 2));
                        let sc = _mm512_cvtepi8_epi32(scales_by_16(scales, 8 * half + 2 * s));
                        let b = 8 * i + 4 * half + s;
                        for r in 0..R {
                            let (act, da) = act_pair(&a[r], b);
                            let centered =
                                _mm512_sub_epi32(dpbusd(zero, q, act), dpbusd(zero, four, act));
                            let dot = _mm512_cvtepi32_ps(_mm512_mullo_epi32(centered, sc));
                            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, da), acc[r]);
                        }
                    }
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn dot_q5k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q5K.block_bytes();
            let zero = _mm512_setzero_si512();
            let low = _mm256_set1_epi8(0x0F);
            let one = _mm512_set1_epi8(1);
            let mut acc = [_mm512_setzero_ps(); R];
            let mut min_acc = [_mm512_setzero_ps(); R];
            for (i, block) in w.chunks_exact(bb).enumerate() {
                let (scale, min) = q4k_block_scales(
                    f16_at(block, 0),
                    f16_at(block, 2),
                    &block[Q5K_SCALES..Q5K_SCALES + 12],
                );
                // Bit k of byte l: element 32k + l's fifth bit.
                let qh = both_halves(block.as_ptr().add(Q5K_QH));
                for j in 0..4 {
                    let raw = _mm256_loadu_si256(block.as_ptr().add(Q5K_QS + 32 * j).cast());
                    let lo = _mm256_and_si256(raw, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    // Elements 64j..64j+64: low nibbles, then high ones.
                    let nibbles = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                    let shift = halves_epi16(2 * j as i16, 2 * j as i16 + 1);
                    let fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), one);
                    let q = _mm512_or_si512(nibbles, _mm512_slli_epi16(fifth, 4));
                    let w_scale = halves_ps(scale[2 * j], scale[2 * j + 1]);
                    let w_min = halves_ps(min[2 * j], min[2 * j + 1]);
                    let b = 8 * i + 2 * j;
                    for r in 0..R {
                        let (act, da) = act_pair(&a[r], b);
                        let s8 = _mm512_loadu_ps(a[r].spread.as_ptr().add(16 * b + 16));
                        let dot = _mm512_cvtepi32_ps(dpbusd(zero, q, act));
                        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dot, da), w_scale, acc[r]);
                        min_acc[r] = _mm512_fmadd_ps(w_min, s8, min_acc[r]);
                    }
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]) + _mm512_reduce_add_ps(min_acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn dot_iq4xs<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::IQ4XS.block_bytes();
            let zero = _mm512_setzero_si512();
            let low = _mm256_set1_epi8(0x0F);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_VALUES.as_ptr().cast()));
            let mut acc = [_mm512_setzero_ps(); R];
            for (i, block) in w.chunks_exact(bb).enumerate() {
                let d = f16_at(block, 0);
                for p in 0..4 {
                    let raw = _mm256_loadu_si256(block.as_ptr().add(IQ4XS_QS + 32 * p).cast());
                    let lo = _mm256_and_si256(raw, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    // 128-bit lanes [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1,
                    // hi1]: element order of sub-blocks 2p and 2p+1.
                    let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                    let v = _mm512_shuffle_epi8(table, _mm512_shuffle_i64x2(z, z, 0b11_01_10_00));
                    let abs_v = _mm512_abs_epi8(v);
                    let negative = _mm512_movepi8_mask(v);
                    let w_scale = halves_ps(
                        d * f32::from(iq4xs_scale(block, 2 * p)),
                        d * f32::from(iq4xs_scale(block, 2 * p + 1)),
                    );
                    let b = 8 * i + 2 * p;
                    for r in 0..R {
                        let (act, da) = act_pair(&a[r], b);
                        // |v| · (a with v's sign) = v · a, unsigned on the left.
                        let signed = _mm512_mask_sub_epi8(act, negative, zero, act);
                        let dot = _mm512_cvtepi32_ps(dpbusd(zero, abs_v, signed));
                        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dot, da), w_scale, acc[r]);
                    }
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }
    };
}

/// AVX-512 F/BW with VNNI.
pub(crate) mod vnni {
    avx512_low_bit_kernels!("avx512f,avx512bw,avx512vnni,avx2,fma,f16c", vnni = true);
}

/// AVX-512 F/BW without VNNI.
pub(crate) mod plain {
    avx512_low_bit_kernels!("avx512f,avx512bw,avx2,fma,f16c", vnni = false);
}
