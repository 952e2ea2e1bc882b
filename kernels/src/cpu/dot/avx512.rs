//! AVX-512 (F + BW) dot products, two 32-element blocks (one zmm) per step.
//!
//! The same kernels are compiled twice by [`avx512_kernels!`]: `vnni` uses
//! `vpdpbusd`; `plain` emulates it with `vpmaddubsw` + `vpmaddwd`, which
//! saturates i16 pair sums, so (as in the AVX2 kernels) the unsigned operand
//! never exceeds 128 against activations in -127..=127.
//!
//! # Safety
//! Every function needs the features its module's macro call names, and
//! the shape preconditions checked by `dot::dot_quantized`/`dot::dot_float`.

/// Expands to the AVX-512 kernels for one feature set.
macro_rules! avx512_kernels {
    ($features:literal, vnni = $vnni:tt) => {
        use std::arch::x86_64::*;

        use crate::cpu::quant_act::QRow;
        use crate::formats::blocks::q4k_block_scales;
        use crate::formats::blocks::{
            bf16_at, f16_at, f32_at, NibbleBlock, Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH, Q6K_SCALES,
            Q8_0_QS, QK,
        };
        use crate::DType;

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_quantized<const R: usize>(
            dtype: DType,
            w: &[u8],
            row_bytes: usize,
            a: &[QRow<'_>; R],
            out: &mut [f32],
        ) {
            let rows = w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0);
            match dtype {
                DType::Q8_0 => {
                    for (w, o) in rows {
                        dot_q8_0(w, a, o);
                    }
                }
                DType::Q4_0 => {
                    for (w, o) in rows {
                        dot_nibbles::<R, false, false>(w, a, o);
                    }
                }
                DType::Q4_1 => {
                    for (w, o) in rows {
                        dot_nibbles::<R, true, false>(w, a, o);
                    }
                }
                DType::Q5_0 => {
                    for (w, o) in rows {
                        dot_nibbles::<R, false, true>(w, a, o);
                    }
                }
                DType::Q5_1 => {
                    for (w, o) in rows {
                        dot_nibbles::<R, true, true>(w, a, o);
                    }
                }
                DType::Q4K => {
                    for (w, o) in rows {
                        dot_q4k(w, a, o);
                    }
                }
                DType::Q6K => {
                    for (w, o) in rows {
                        dot_q6k(w, a, o);
                    }
                }
                // Q2_K, Q3_K, Q5_K and IQ4_XS go to `avx512_low_bit`
                // first; IQ4_NL's tail rows take the AVX2 kernel.
                DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4NL | DType::IQ4XS => {
                    crate::cpu::dot::avx2_low_bit::dot_quantized(dtype, w, row_bytes, a, out)
                }
                DType::F32 | DType::F16 | DType::BF16 => {
                    for (_, o) in rows {
                        *o = [f32::NAN; R];
                    }
                }
            }
        }

        /// `acc + Σ u·s` over groups of four bytes (u8 × i8 → i32).
        #[target_feature(enable = $features)]
        #[inline]
        fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
            dpbusd_body!($vnni, acc, u, s)
        }

        /// Lanes 0 and 2 of `v`, each broadcast to one 256-bit half.
        #[target_feature(enable = $features)]
        #[inline]
        fn spread_lanes_0_2(v: __m128) -> __m512 {
            let index = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
            _mm512_permutexvar_ps(index, _mm512_castps128_ps512(v))
        }

        /// Activation blocks `b, b+1` (64 bytes), or block `b` alone with
        /// zeros above when `pair` is false (never reading past the row).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn act_blocks(a: &QRow<'_>, b: usize, pair: bool) -> __m512i {
            let p = a.qs.as_ptr().add(b * QK);
            if pair {
                _mm512_loadu_si512(p.cast())
            } else {
                _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast()))
            }
        }

        /// `[d_b, s_b, d_b+1, s_b+1]` (both blocks must exist).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn act_ds(a: &QRow<'_>, b: usize) -> __m128 {
            _mm_loadu_ps(a.ds.as_ptr().add(2 * b))
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn read_u16(p: *const u8) -> i32 {
            i32::from(p.cast::<u16>().read_unaligned())
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_q8_0<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q8_0.block_bytes();
            let blocks = w.len() / bb;
            let zero = _mm512_setzero_si512();
            let first_half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let mut acc = [_mm512_setzero_ps(); R];
            let mut b = 0;
            while b < blocks {
                let pair = b + 1 < blocks;
                let block = w.as_ptr().add(b * bb);
                let q0 = _mm256_loadu_si256(block.add(Q8_0_QS).cast());
                let (q, d_bits) = if pair {
                    let q1 = _mm256_loadu_si256(block.add(bb + Q8_0_QS).cast());
                    let q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
                    (
                        q,
                        _mm_insert_epi16(
                            _mm_cvtsi32_si128(read_u16(block)),
                            read_u16(block.add(bb)),
                            1,
                        ),
                    )
                } else {
                    (
                        _mm512_zextsi256_si512(q0),
                        _mm_cvtsi32_si128(read_u16(block)),
                    )
                };
                // [d0 ×8, d1 ×8]
                let w_d =
                    _mm512_permutexvar_ps(first_half, _mm512_castps128_ps512(_mm_cvtph_ps(d_bits)));
                let abs_q = _mm512_abs_epi8(q);
                let negative = _mm512_movepi8_mask(q);
                for r in 0..R {
                    let act = act_blocks(&a[r], b, pair);
                    // |w| · (a with w's sign) = w · a, unsigned on the left.
                    let signed = _mm512_mask_sub_epi8(act, negative, zero, act);
                    let dot = _mm512_cvtepi32_ps(dpbusd(zero, abs_q, signed));
                    let a_d = _mm512_loadu_ps(a[r].spread.as_ptr().add(16 * b));
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dot, a_d), w_d, acc[r]);
                }
                b += 2;
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }

        /// Q4_0, Q4_1, Q5_0 (`FIVE`) and Q5_1 as `q·d + m` (`HAS_MIN ==
        /// false`: `m = -offset·d`).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_nibbles<const R: usize, const HAS_MIN: bool, const FIVE: bool>(
            w: &[u8],
            a: &[QRow<'_>; R],
            out: &mut [f32; R],
        ) {
            let layout = const { NibbleBlock::of(HAS_MIN, FIVE) };
            let (bb, qs_at) = (layout.bytes, layout.qs);
            let blocks = w.len() / bb;
            let low = _mm256_set1_epi8(0x0F);
            let zero = _mm512_setzero_si512();
            let minus_offset = _mm_setr_ps(1.0, -layout.offset, 1.0, -layout.offset);
            let even = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
            let odd = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
            let mut acc = [_mm512_setzero_ps(); R];
            let mut min_acc = [_mm512_setzero_ps(); R];
            let mut b = 0;
            while b < blocks {
                let pair = b + 1 < blocks;
                let block = w.as_ptr().add(b * bb);
                let raw0 = _mm_loadu_si128(block.add(qs_at).cast());
                let raw1 = if pair {
                    _mm_loadu_si128(block.add(bb + qs_at).cast())
                } else {
                    _mm_setzero_si128()
                };
                // [d0, m0, d1, m1]
                let dm = if HAS_MIN {
                    let first = _mm_cvtsi32_si128(block.cast::<i32>().read_unaligned());
                    let both = if pair {
                        _mm_insert_epi32(first, block.add(bb).cast::<i32>().read_unaligned(), 1)
                    } else {
                        first
                    };
                    _mm_cvtph_ps(both)
                } else {
                    let first = _mm_cvtsi32_si128(read_u16(block));
                    let both = if pair {
                        _mm_insert_epi16(first, read_u16(block.add(bb)), 1)
                    } else {
                        first
                    };
                    // [d0, d1, ..] -> [d0, d0, d1, d1] · [1, -8, 1, -8]
                    let d = _mm_cvtph_ps(both);
                    _mm_mul_ps(_mm_unpacklo_ps(d, d), minus_offset)
                };
                let dm = _mm512_castps128_ps512(dm);
                // [d0 ×8, d1 ×8] and [m0 ×8, m1 ×8]
                let w_d = _mm512_permutexvar_ps(even, dm);
                let w_m = _mm512_permutexvar_ps(odd, dm);
                let raw = _mm256_inserti128_si256(_mm256_castsi128_si256(raw0), raw1, 1);
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                // 128-bit lanes [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1, hi1]:
                // element order of two consecutive blocks.
                let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                let mut q = _mm512_shuffle_i64x2(z, z, 0b11_01_10_00);
                if let Some(qh) = layout.qh {
                    // Bit j of the two u32 is element j's fifth bit.
                    let first = u64::from(block.add(qh).cast::<u32>().read_unaligned());
                    let second = if pair {
                        u64::from(block.add(bb + qh).cast::<u32>().read_unaligned())
                    } else {
                        0
                    };
                    let high = _mm512_maskz_mov_epi8(first | second << 32, _mm512_set1_epi8(0x10));
                    q = _mm512_or_si512(q, high);
                }
                for r in 0..R {
                    let spread = a[r].spread.as_ptr().add(16 * b);
                    let dot = _mm512_cvtepi32_ps(dpbusd(zero, q, act_blocks(&a[r], b, pair)));
                    let a_d = _mm512_loadu_ps(spread);
                    let a_s8 = _mm512_loadu_ps(spread.add(16));
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dot, a_d), w_d, acc[r]);
                    min_acc[r] = _mm512_fmadd_ps(w_m, a_s8, min_acc[r]);
                }
                b += 2;
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]) + _mm512_reduce_add_ps(min_acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_q4k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q4K.block_bytes();
            let blocks = w.len() / bb;
            let low = _mm256_set1_epi8(0x0F);
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); R];
            let mut min_acc = [_mm512_setzero_ps(); R];
            for i in 0..blocks {
                let block = &w[i * bb..(i + 1) * bb];
                let (scale, min) = q4k_block_scales(
                    f16_at(block, 0),
                    f16_at(block, 2),
                    &block[Q4K_SCALES..Q4K_SCALES + 12],
                );
                let mut interleaved = [0.0f32; 16];
                for j in 0..8 {
                    interleaved[2 * j] = scale[j];
                    interleaved[2 * j + 1] = min[j];
                }
                // [scale0, min0, scale1, min1, ...]
                let w_scales = _mm512_loadu_ps(interleaved.as_ptr());
                for r in 0..R {
                    // [scale_j·d_a, min_j·s, ...] for the 8 activation blocks
                    let products =
                        _mm512_mul_ps(w_scales, _mm512_loadu_ps(a[r].ds.as_ptr().add(16 * i)));
                    min_acc[r] = _mm512_add_ps(min_acc[r], products);
                    for j in 0..4 {
                        let raw = _mm256_loadu_si256(block.as_ptr().add(Q4K_QS + 32 * j).cast());
                        let lo = _mm256_and_si256(raw, low);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                        // Elements 64j..64j+64: low nibbles, then high ones.
                        let q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                        let act = _mm512_loadu_si512(a[r].qs.as_ptr().add(256 * i + 64 * j).cast());
                        let dot = _mm512_cvtepi32_ps(dpbusd(zero, q, act));
                        let jj = 4 * j as i32;
                        let index = _mm512_setr_epi32(
                            jj,
                            jj,
                            jj,
                            jj,
                            jj,
                            jj,
                            jj,
                            jj,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                            jj + 2,
                        );
                        acc[r] =
                            _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(index, products), acc[r]);
                    }
                }
            }
            for r in 0..R {
                out[r] =
                    _mm512_reduce_add_ps(acc[r]) + _mm512_mask_reduce_add_ps(0xAAAA, min_acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_q6k<const R: usize>(w: &[u8], a: &[QRow<'_>; R], out: &mut [f32; R]) {
            let bb = DType::Q6K.block_bytes();
            let blocks = w.len() / bb;
            let zero = _mm512_setzero_si512();
            let low = _mm512_set1_epi8(0x0F);
            let two_bits = _mm512_set1_epi8(0x03);
            let thirty_two = _mm512_set1_epi8(32);
            // qh is broadcast to both 256-bit halves; each half shifts its
            // copy by a different amount (16-bit lanes: 16 per half).
            let shift_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
            let shift_b = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16(4)),
                _mm256_set1_epi16(6),
                1,
            );
            let mut acc = [_mm512_setzero_ps(); R];
            for i in 0..blocks {
                let block = w.as_ptr().add(i * bb);
                let d = _mm512_set1_ps(f16_at(std::slice::from_raw_parts(block.add(Q6K_D), 2), 0));
                let scales = _mm_loadu_si128(block.add(Q6K_SCALES).cast());
                for half in 0..2 {
                    let ql = _mm512_loadu_si512(block.add(64 * half).cast());
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        block.add(Q6K_QH + 32 * half).cast(),
                    ));
                    let high_a = _mm512_slli_epi16(
                        _mm512_and_si512(_mm512_srlv_epi16(qh, shift_a), two_bits),
                        4,
                    );
                    let high_b = _mm512_slli_epi16(
                        _mm512_and_si512(_mm512_srlv_epi16(qh, shift_b), two_bits),
                        4,
                    );
                    // Elements 0..64 of the half: low nibbles of ql[0..64];
                    // 64..128: high nibbles.
                    let chunks = [
                        _mm512_or_si512(_mm512_and_si512(ql, low), high_a),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), high_b),
                    ];
                    for (c, q) in chunks.into_iter().enumerate() {
                        let chunk = 2 * half + c;
                        // Scales 4·chunk .. 4·chunk+4, each for 16 elements
                        // = four i32 lanes of the dot product.
                        let s = 4 * chunk as i8;
                        let pick = _mm_setr_epi8(
                            s,
                            s,
                            s,
                            s,
                            s + 1,
                            s + 1,
                            s + 1,
                            s + 1,
                            s + 2,
                            s + 2,
                            s + 2,
                            s + 2,
                            s + 3,
                            s + 3,
                            s + 3,
                            s + 3,
                        );
                        let sc = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, pick));
                        let b = 8 * i + 2 * chunk;
                        for r in 0..R {
                            let act = _mm512_loadu_si512(a[r].qs.as_ptr().add(b * QK).cast());
                            let centered = _mm512_sub_epi32(
                                dpbusd(zero, q, act),
                                dpbusd(zero, thirty_two, act),
                            );
                            let dot = _mm512_cvtepi32_ps(_mm512_mullo_epi32(centered, sc));
                            let scale = _mm512_mul_ps(d, spread_lanes_0_2(act_ds(&a[r], b)));
                            acc[r] = _mm512_fmadd_ps(dot, scale, acc[r]);
                        }
                    }
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_float<const R: usize>(
            dtype: DType,
            w: &[u8],
            row_bytes: usize,
            x: &[&[f32]; R],
            out: &mut [f32],
        ) {
            for (w, o) in w.chunks_exact(row_bytes).zip(out.as_chunks_mut::<R>().0) {
                dot_float_row(dtype, w, x, o);
            }
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_float_row<const R: usize>(
            dtype: DType,
            w: &[u8],
            x: &[&[f32]; R],
            out: &mut [f32; R],
        ) {
            let k = x.first().map_or(0, |x| x.len());
            let mut acc = [_mm512_setzero_ps(); R];
            let mut i = 0;
            while i + 16 <= k {
                let weights = match dtype {
                    DType::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(2 * i).cast())),
                    DType::BF16 => _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(w.as_ptr().add(2 * i).cast())),
                        16,
                    )),
                    _ => _mm512_loadu_ps(w.as_ptr().add(4 * i).cast()),
                };
                for r in 0..R {
                    acc[r] =
                        _mm512_fmadd_ps(weights, _mm512_loadu_ps(x[r].as_ptr().add(i)), acc[r]);
                }
                i += 16;
            }
            for r in 0..R {
                let mut sum = _mm512_reduce_add_ps(acc[r]);
                for j in i..k {
                    let weight = match dtype {
                        DType::F16 => f16_at(w, 2 * j),
                        DType::BF16 => bf16_at(w, 2 * j),
                        _ => f32_at(w, 4 * j),
                    };
                    sum += weight * x[r][j];
                }
                out[r] = sum;
            }
        }
    };
}

/// `vpdpbusd`, or its two-instruction emulation.
macro_rules! dpbusd_body {
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

/// AVX-512 F/BW with VNNI.
pub(crate) mod vnni {
    avx512_kernels!("avx512f,avx512bw,avx512vnni,avx2,fma,f16c", vnni = true);
}

/// AVX-512 F/BW without VNNI.
pub(crate) mod plain {
    avx512_kernels!("avx512f,avx512bw,avx2,fma,f16c", vnni = false);
}
