//! The group kernels for whole tiles of sixteen activation rows on
//! AMX-INT8 (`tdpbssd`: a 16×16 block of i32 sums gains 64 products each
//! in one instruction, 16,384 multiply-adds, where `vpdpbusd` does 64),
//! for prompt chunks on CPUs with AMX (Intel Sapphire Rapids and later).
//!
//! A group is unpacked once (per task) into signed bytes laid out as
//! `tdpbssd`'s second operand (`Unpacked`), and every sixteen-row tile of
//! the prompt chunk then runs against it: the activation rows are the
//! first operand straight from the quantized rows (16 rows of 64 bytes at
//! the row stride), the C tile row `t` holds activation row `t`'s sums for
//! the group's sixteen weight rows, i.e. the lanes of the VNNI kernels'
//! accumulator.
//!
//! # Exactness
//! The contract (the module documentation of `packed`) needs each
//! 32-element block's integer sum on its own: a tile row is 64 bytes, two
//! blocks, so each block's words are followed by eight zero rows, and two
//! `tdpbssd` per tile row pair (one seeing block `2p` and zeros, one zeros
//! and block `2p + 1`) give the two sums apart. The unsigned offsets the
//! VNNI kernels take off as `offset · Σq_a` are taken off the unpacked
//! bytes instead (`q - offset`, signed), which gives the same integer.
//! Q6_K's scales cover 16 elements: its halves each get twelve zero rows,
//! four `tdpbssd` per pair. From the integer sums on, the f32 steps are the
//! VNNI kernels' (`add_block`, `dot_q4k`, `dot_q6k`) one for one, so the
//! results match them, and `scalar`, bit for bit.
//!
//! # Safety
//! Every function needs AMX-INT8 granted ([`crate::cpu::amx::int8_available`])
//! and AVX-512 F/BW/VNNI and F16C.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx512::{nibble_block, q8_block, store};
use super::avx512_k::{k_scales, q4k_sub, q6k_sub};
use super::layout::{quant_offset, Layout, GROUP_ROWS};
use crate::cpu::amx::configure;
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::QK;
use crate::DType;

/// Activation rows of one AMX call: a tile's sixteen rows.
pub(crate) const AMX_ROWS: usize = 16;

/// One tile row of 64 bytes, aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([i8; 64]);

const ZERO_LINE: Line = Line([0; 64]);

/// How the unpacked words of one 32-element block lie.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 16 lines: the eight words, eight zero lines.
    Pair,
    /// Q6_K: per 16-element half 16 lines, its four words then twelve zero.
    Quarter,
}

impl Shape {
    const fn lines_per_block(self) -> usize {
        match self {
            Shape::Pair => 16,
            Shape::Quarter => 32,
        }
    }
}

/// A group unpacked for `tdpbssd`, with its per-block weight scales.
#[derive(Default)]
pub(crate) struct Unpacked {
    /// 32-element blocks per row.
    blocks: usize,
    dtype: Option<DType>,
    /// The B tiles' rows (see [`Shape`]); zero lines are written once,
    /// when the buffer grows, and never again.
    lines: Vec<Line>,
    /// Per block, the sixteen rows' `d` (Q4_K `d · sc`, Q6_K the
    /// super-block's `d`).
    scale: Vec<[f32; GROUP_ROWS]>,
    /// Per block, `m` (Q4_1/Q5_1) or `dmin · m` (Q4_K).
    min: Vec<[f32; GROUP_ROWS]>,
    /// Q6_K, per block, the two halves' i8 scales as i32.
    sc: Vec<[[i32; GROUP_ROWS]; 2]>,
}

thread_local! {
    /// One buffer per [`Shape`], so that each one's zero lines stay zero.
    static SCRATCH: RefCell<[Unpacked; 2]> = RefCell::new(Default::default());
}

/// Whether [`with_group`] takes matrices of `dtype` with `blocks` of its
/// blocks per row: every packed type, when a row is whole tile rows (an
/// even number of 32-element blocks).
pub(crate) fn takes(dtype: DType, elems_per_row: usize) -> bool {
    (elems_per_row / QK).is_multiple_of(2)
        && matches!(
            dtype,
            DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q8_0
                | DType::IQ4NL
                | DType::Q4K
                | DType::Q6K
        )
}

/// Unpacks `group` (`blocks` of `dtype`'s blocks) into this thread's
/// scratch and calls `f` with it. Returns `None` when the scratch is in use
/// (a nested call on this thread).
///
/// # Safety
/// See the module; [`takes`] is true for `dtype` and the row width.
pub(crate) unsafe fn with_group<R>(
    dtype: DType,
    group: &[u8],
    blocks: usize,
    f: impl FnOnce(&Unpacked) -> R,
) -> Option<R> {
    let shape = if dtype == DType::Q6K {
        Shape::Quarter
    } else {
        Shape::Pair
    };
    SCRATCH.with(|cell| {
        let mut scratch = cell.try_borrow_mut().ok()?;
        let u = &mut scratch[shape as usize];
        // SAFETY: the caller's contract.
        unsafe { unpack(dtype, shape, group, blocks, u) };
        Some(f(u))
    })
}

/// Fills `u` from `group`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack(dtype: DType, shape: Shape, group: &[u8], blocks: usize, u: &mut Unpacked) {
    let layout = Layout::of(dtype);
    let ab = blocks * layout.elems / QK;
    let lines = ab * shape.lines_per_block();
    if u.lines.len() < lines {
        u.lines.resize(lines, ZERO_LINE);
    }
    u.scale.resize(ab, [0.0; GROUP_ROWS]);
    u.min.resize(ab, [0.0; GROUP_ROWS]);
    if shape == Shape::Quarter {
        u.sc.resize(ab, [[0; GROUP_ROWS]; 2]);
    }
    u.blocks = ab;
    u.dtype = Some(dtype);
    let g = group.as_ptr();
    // Q6_K's 32 comes off per half in the VNNI kernel (`32 · Σ_half q_a`),
    // the same integer as off each quant here.
    let offset = match dtype {
        DType::Q6K => 32,
        dtype => quant_offset(dtype),
    };
    let offset = _mm512_set1_epi8(offset as u8 as i8);
    // SAFETY (all arms): the group holds `blocks` blocks in `layout` (the
    // caller's contract); every index below is under `ab` or `lines`.
    unsafe {
        // Block b's words on its first eight lines, signed.
        let put_pair = |u: &mut Unpacked, b: usize, w: [__m512i; 8]| {
            for (i, w) in w.into_iter().enumerate() {
                put(u, 16 * b + i, _mm512_sub_epi8(w, offset));
            }
        };
        match dtype {
            DType::Q8_0 => {
                for b in 0..blocks {
                    let (w, d) = q8_block(g, &layout, b);
                    put_pair(u, b, w);
                    u.scale[b] = f32s(d);
                }
            }
            DType::Q4K => {
                for b in 0..blocks {
                    let (d, dmin) = k_scales(g, &layout, b);
                    for j in 0..8 {
                        let (w, scale, min) = q4k_sub(g, &layout, b, j, d, dmin);
                        put_pair(u, 8 * b + j, w);
                        u.scale[8 * b + j] = f32s(scale);
                        u.min[8 * b + j] = f32s(min);
                    }
                }
            }
            DType::Q6K => {
                for b in 0..blocks {
                    let (d, _) = k_scales(g, &layout, b);
                    for j in 0..8 {
                        let (w, sc0, sc1) = q6k_sub(g, &layout, b, j);
                        let at = 8 * b + j;
                        for (i, w) in w.into_iter().enumerate() {
                            // Half i / 4's lines start at 16 · (2 · at + i / 4).
                            let line = 16 * (2 * at + i / 4) + i % 4;
                            put(u, line, _mm512_sub_epi8(w, offset));
                        }
                        u.scale[at] = f32s(d);
                        let mut sc = [[0i32; GROUP_ROWS]; 2];
                        _mm512_storeu_si512(sc[0].as_mut_ptr().cast(), sc0);
                        _mm512_storeu_si512(sc[1].as_mut_ptr().cast(), sc1);
                        u.sc[at] = sc;
                    }
                }
            }
            _ => {
                for b in 0..blocks {
                    let (w, d, m) = match dtype {
                        DType::Q4_1 => nibble_block::<true, false, false>(g, &layout, b),
                        DType::Q5_0 => nibble_block::<false, true, false>(g, &layout, b),
                        DType::Q5_1 => nibble_block::<true, true, false>(g, &layout, b),
                        DType::IQ4NL => nibble_block::<false, false, true>(g, &layout, b),
                        _ => nibble_block::<false, false, false>(g, &layout, b),
                    };
                    put_pair(u, b, w);
                    u.scale[b] = f32s(d);
                    u.min[b] = f32s(m);
                }
            }
        }
    }
}

/// One tile row pair's products: the A tile (`tmm0`) sixteen rows of 64
/// bytes at `a`, `stride` apart; then per B tile at `b[i]` (16 lines)
/// `tdpbssd` into a zeroed C tile stored at `c[i]` (16 lines).
///
/// # Safety
/// See the module; the pointers are valid for those reads and writes.
#[inline(always)]
unsafe fn products<const N: usize>(a: *const i8, stride: usize, b: [*const Line; N], c: [*mut Line; N]) {
    // SAFETY: the caller's contract; tile numbers are immediates, the
    // configuration (16 rows of 64 bytes) is `configure`'s.
    unsafe {
        asm!(
            "tileloadd tmm0, [{a} + {stride}]",
            a = in(reg) a,
            stride = in(reg) stride,
            options(nostack, readonly, preserves_flags)
        );
        for i in 0..N {
            asm!(
                "tileloadd tmm1, [{b} + {line}]",
                "tilezero tmm2",
                "tdpbssd tmm2, tmm0, tmm1",
                "tilestored [{c} + {line}], tmm2",
                b = in(reg) b[i],
                c = in(reg) c[i],
                line = in(reg) 64usize,
                options(nostack, preserves_flags)
            );
        }
    }
}

/// Stores `w` at line `at` of `u`.
///
/// # Safety
/// `at < u.lines.len()`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn put(u: &mut Unpacked, at: usize, w: __m512i) {
    // SAFETY: the caller's contract; lines are 64-byte aligned.
    unsafe { _mm512_store_si512(u.lines.as_mut_ptr().add(at).cast(), w) };
}

/// The sixteen lanes of `v`.
#[target_feature(enable = "avx512f")]
#[inline]
fn f32s(v: __m512) -> [f32; GROUP_ROWS] {
    let mut out = [0.0f32; GROUP_ROWS];
    // SAFETY: sixteen floats.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    out
}

impl Unpacked {
    /// 32-element blocks per row.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// `out[t][r] = W[r] · a[t]` for this group's sixteen rows and the
    /// tile's sixteen activation rows (or `+=` with `accumulate`, as
    /// `PackedRows::dot_group`). Gives `out` back untouched when the rows
    /// do not lie one after another in one buffer (the A tile loads them
    /// at one stride) or are not this group's width.
    ///
    /// # Safety
    /// See the module; the rows' scale arrays hold `self.blocks` blocks
    /// (`PackedRows::tile` checks them).
    pub(crate) unsafe fn dot<'o>(
        &self,
        a: &[QRow<'_>; AMX_ROWS],
        out: [&'o mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) -> Result<(), [&'o mut [f32; GROUP_ROWS]; AMX_ROWS]> {
        let k = self.blocks * QK;
        let base = a[0].qs.as_ptr();
        let contiguous = a.iter().enumerate().all(|(t, row)| {
            row.qs.len() == k && std::ptr::eq(row.qs.as_ptr(), base.wrapping_add(t * k))
        });
        if !contiguous || self.dtype.is_none() {
            return Err(out);
        }
        // SAFETY: the caller's contract; the rows are checked above.
        unsafe {
            configure();
            match self.dtype {
                Some(DType::Q6K) => self.dot_quarters(a, out, accumulate),
                Some(DType::Q4K) => self.dot_pairs::<-1>(a, out, accumulate),
                Some(DType::Q4_1 | DType::Q5_1) => self.dot_pairs::<1>(a, out, accumulate),
                _ => self.dot_pairs::<0>(a, out, accumulate),
            }
        }
        Ok(())
    }

    /// The 32-element types and Q4_K; `MIN`: how the block's min enters
    /// (`1`: `+ m · s_a`, `-1`: `- m · s_a`, `0`: not).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot_pairs<const MIN: i32>(
        &self,
        a: &[QRow<'_>; AMX_ROWS],
        out: [&mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) {
        let k = self.blocks * QK;
        let mut c = [ZERO_LINE; 2 * 16];
        let cp = c.as_mut_ptr();
        let lines = self.lines.as_ptr();
        let ds: [*const f32; AMX_ROWS] = std::array::from_fn(|t| a[t].ds.as_ptr());
        let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
        for p in 0..self.blocks / 2 {
            // SAFETY: the tile row pair `p` (bytes `64p..64p + 64` of each
            // of sixteen rows `k` apart, checked by `dot`), block `2p`'s
            // sixteen lines, and block `2p`'s last eight with block
            // `2p + 1`'s first eight; `c` holds two tiles.
            unsafe {
                products(
                    a[0].qs.as_ptr().add(64 * p),
                    k,
                    [lines.add(32 * p), lines.add(32 * p + 8)],
                    [cp, cp.add(16)],
                );
            }
            for h in 0..2 {
                let b = 2 * p + h;
                // SAFETY: b < self.blocks; `c`'s tile h is sixteen lines.
                let (scale, min, sums) = unsafe {
                    (
                        _mm512_loadu_ps(self.scale.as_ptr().add(b).cast()),
                        _mm512_loadu_ps(self.min.as_ptr().add(b).cast()),
                        cp.add(16 * h).cast::<__m512i>(),
                    )
                };
                for_each_row!(AMX_ROWS, t, {
                    // SAFETY: row t's block b scales; line t of tile h.
                    let (da, sa, isum) = unsafe {
                        (
                            *ds[t].add(2 * b),
                            *ds[t].add(2 * b + 1),
                            _mm512_load_si512(sums.add(t)),
                        )
                    };
                    let isum = _mm512_cvtepi32_ps(isum);
                    let scale = _mm512_mul_ps(scale, _mm512_set1_ps(da));
                    acc[t] = _mm512_fmadd_ps(isum, scale, acc[t]);
                    if MIN > 0 {
                        acc[t] = _mm512_fmadd_ps(min, _mm512_set1_ps(sa), acc[t]);
                    } else if MIN < 0 {
                        acc[t] = _mm512_fnmadd_ps(min, _mm512_set1_ps(sa), acc[t]);
                    }
                });
            }
        }
        for (o, acc) in out.into_iter().zip(acc) {
            // SAFETY: `o` is sixteen f32.
            unsafe { store(o, acc, accumulate) };
        }
    }

    /// Q6_K: four `tdpbssd` per tile row pair, one per 16-element half.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot_quarters(
        &self,
        a: &[QRow<'_>; AMX_ROWS],
        out: [&mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) {
        let k = self.blocks * QK;
        let mut c = [ZERO_LINE; 4 * 16];
        let cp = c.as_mut_ptr();
        let lines = self.lines.as_ptr();
        let ds: [*const f32; AMX_ROWS] = std::array::from_fn(|t| a[t].ds.as_ptr());
        let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
        for p in 0..self.blocks / 2 {
            // SAFETY: as in `dot_pairs`; half `i` (of four) of the pair
            // starts at line `16 · (4p + i)`, its B tile `4i` lines before,
            // inside the previous half's zero lines (or at the first
            // half's own start for i = 0).
            unsafe {
                let half = |i: usize| lines.add(16 * (4 * p + i) - 4 * i);
                products(
                    a[0].qs.as_ptr().add(64 * p),
                    k,
                    [half(0), half(1), half(2), half(3)],
                    [cp, cp.add(16), cp.add(32), cp.add(48)],
                );
            }
            for h in 0..2 {
                let b = 2 * p + h;
                // SAFETY: b < self.blocks; `c`'s tiles 2h, 2h + 1.
                let (d, sc0, sc1, s0, s1) = unsafe {
                    let sc = self.sc.as_ptr().add(b).cast::<i32>();
                    (
                        _mm512_loadu_ps(self.scale.as_ptr().add(b).cast()),
                        _mm512_loadu_si512(sc.cast()),
                        _mm512_loadu_si512(sc.add(GROUP_ROWS).cast()),
                        cp.add(32 * h).cast::<__m512i>(),
                        cp.add(32 * h + 16).cast::<__m512i>(),
                    )
                };
                for_each_row!(AMX_ROWS, t, {
                    // SAFETY: row t's block b scale; line t of both tiles.
                    let (da, x0, x1) = unsafe {
                        (
                            *ds[t].add(2 * b),
                            _mm512_load_si512(s0.add(t)),
                            _mm512_load_si512(s1.add(t)),
                        )
                    };
                    let isum =
                        _mm512_add_epi32(_mm512_mullo_epi32(x0, sc0), _mm512_mullo_epi32(x1, sc1));
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
                });
            }
        }
        for (o, acc) in out.into_iter().zip(acc) {
            // SAFETY: `o` is sixteen f32.
            unsafe { store(o, acc, accumulate) };
        }
    }
}
