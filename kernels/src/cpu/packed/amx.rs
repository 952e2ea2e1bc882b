//! The group kernels for whole tiles of sixteen activation rows on
//! AMX-INT8 (`tdpbssd`: a 16×16 block of i32 sums gains 64 products each
//! in one instruction, 16,384 multiply-adds, where `vpdpbusd` does 64),
//! for prompt chunks on CPUs with AMX (Intel Sapphire Rapids and later).
//!
//! A group is unpacked once (per task) into signed bytes laid out as
//! `tdpbssd`'s second operand (`Unpacked`), and every sixteen-row tile of
//! the prompt chunk then runs against it: the activation rows are the
//! first operand, copied once per call into tile order (`AmxRows`: each
//! tile row pair's sixteen rows of 64 bytes in one contiguous kilobyte),
//! the C tile row `t` holds activation row `t`'s sums for the group's
//! sixteen weight rows, i.e. the lanes of the VNNI kernels' accumulator.
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
use super::layout::{is_packed_type, quant_offset, Layout, GROUP_ROWS};
use crate::cpu::amx::configure;
use crate::cpu::quant_act::QRow;
use crate::formats::blocks::QK;
use crate::DType;

/// Activation rows of one AMX call: a tile's sixteen rows.
pub(crate) const AMX_ROWS: usize = 16;

/// Sixteen quantized activation rows copied into the order the A tiles
/// read them: tile row pair `p` (bytes `64p..64p + 64` of every row) is
/// sixteen consecutive lines, and each block's scales are sixteen
/// consecutive floats. Loaded in place, the A tile's sixteen lines lay a
/// row's width (640-2,048 bytes) apart and came from L2 for every group,
/// the load the tile products waited on most (profile of a Gemma 3
/// prompt); one contiguous kilobyte per pair streams instead, and the
/// scales need one base pointer, not sixteen.
pub(crate) struct AmxRows {
    /// Line `16p + t`: row `t`'s bytes `64p..64p + 64`.
    lines: Vec<Line>,
    /// `d[16b + t]`, `s[16b + t]`: row `t`'s block `b` scale and
    /// (scaled) sum, as the row's `[d, s]` pairs.
    d: Vec<f32>,
    s: Vec<f32>,
    k: usize,
}

impl AmxRows {
    /// `None` unless every row is `k` wide, `k` whole tile rows.
    pub(crate) fn new(a: &[QRow<'_>; AMX_ROWS]) -> Option<AmxRows> {
        let k = a[0].qs.len();
        let blocks = k / QK;
        let fits = k.is_multiple_of(2 * QK)
            && a.iter()
                .all(|row| row.qs.len() == k && row.ds.len() == 2 * blocks);
        if !fits {
            return None;
        }
        let pairs = k / 64;
        let mut lines = vec![ZERO_LINE; pairs * AMX_ROWS];
        for (p, tile) in lines.chunks_exact_mut(AMX_ROWS).enumerate() {
            for (line, row) in tile.iter_mut().zip(a) {
                line.0.copy_from_slice(&row.qs[64 * p..64 * (p + 1)]);
            }
        }
        let scales = |i: usize| -> Vec<f32> {
            (0..blocks * AMX_ROWS)
                .map(|j| a[j % AMX_ROWS].ds[2 * (j / AMX_ROWS) + i])
                .collect()
        };
        Some(AmxRows {
            lines,
            d: scales(0),
            s: scales(1),
            k,
        })
    }
}

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
    (elems_per_row / QK).is_multiple_of(2) && is_packed_type(dtype)
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
                        let (w, scale, min) = q4k_sub::<false>(g, &layout, b, j, d, dmin);
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
                        DType::Q4_1 => nibble_block::<true, false, false, false>(g, &layout, b),
                        DType::Q5_0 => nibble_block::<false, true, false, false>(g, &layout, b),
                        DType::Q5_1 => nibble_block::<true, true, false, false>(g, &layout, b),
                        DType::IQ4NL => nibble_block::<false, false, true, false>(g, &layout, b),
                        _ => nibble_block::<false, false, false, false>(g, &layout, b),
                    };
                    put_pair(u, b, w);
                    u.scale[b] = f32s(d);
                    u.min[b] = f32s(m);
                }
            }
        }
    }
}

// The tile products. A C tile is zeroed, takes one `tdpbssd` and is
// stored: a chain of `tdpbssd`'s latency and the store's. Reusing one C
// tile for every block made each block wait for the last one's store
// (AMX no faster than VNNI in a profile: the samples sat on the tile
// instructions), so each call below keeps four C tiles in flight. Tile
// numbers are immediates; the configuration (16 rows of 64 bytes) is
// `configure`'s.

/// Blocks `4q..4q + 4` (two tile row pairs) of sixteen activation rows:
/// the A tiles at `a[0]` and `a[1]` (sixteen lines each, see
/// [`AmxRows`]), block `i`'s B tile at `b[i]`, its C tile stored at
/// `c + 16 i` (lines).
///
/// # Safety
/// See the module; the pointers are valid for those reads and writes.
#[inline(always)]
unsafe fn four_blocks(a: [*const Line; 2], b: [*const Line; 4], c: *mut Line) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm0, [{a0} + {l}]",
            "tileloadd tmm5, [{a1} + {l}]",
            "tileloadd tmm1, [{b0} + {l}]",
            "tileloadd tmm2, [{b1} + {l}]",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm6",
            "tilezero tmm7",
            "tdpbssd tmm3, tmm0, tmm1",
            "tdpbssd tmm4, tmm0, tmm2",
            "tileloadd tmm1, [{b2} + {l}]",
            "tileloadd tmm2, [{b3} + {l}]",
            "tdpbssd tmm6, tmm5, tmm1",
            "tdpbssd tmm7, tmm5, tmm2",
            "tilestored [{c0} + {l}], tmm3",
            "tilestored [{c1} + {l}], tmm4",
            "tilestored [{c2} + {l}], tmm6",
            "tilestored [{c3} + {l}], tmm7",
            a0 = in(reg) a[0],
            a1 = in(reg) a[1],
            b0 = in(reg) b[0],
            b1 = in(reg) b[1],
            b2 = in(reg) b[2],
            b3 = in(reg) b[3],
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            c2 = in(reg) c.add(32),
            c3 = in(reg) c.add(48),
            l = in(reg) 64usize,
            options(nostack, preserves_flags)
        );
    }
}

/// Blocks `2p, 2p + 1` (one tile row pair) as [`four_blocks`] does four.
///
/// # Safety
/// As [`four_blocks`].
#[inline(always)]
unsafe fn two_blocks(a: *const Line, b: [*const Line; 2], c: *mut Line) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm0, [{a0} + {l}]",
            "tileloadd tmm1, [{b0} + {l}]",
            "tileloadd tmm2, [{b1} + {l}]",
            "tilezero tmm3",
            "tilezero tmm4",
            "tdpbssd tmm3, tmm0, tmm1",
            "tdpbssd tmm4, tmm0, tmm2",
            "tilestored [{c0} + {l}], tmm3",
            "tilestored [{c1} + {l}], tmm4",
            a0 = in(reg) a,
            b0 = in(reg) b[0],
            b1 = in(reg) b[1],
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            l = in(reg) 64usize,
            options(nostack, preserves_flags)
        );
    }
}

/// Q6_K's four 16-element halves of one tile row pair: one A tile, four
/// B tiles at `b[i]`, C tiles stored at `c + 16 i`.
///
/// # Safety
/// As [`four_blocks`].
#[inline(always)]
unsafe fn four_halves(a: *const Line, b: [*const Line; 4], c: *mut Line) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm0, [{a0} + {l}]",
            "tileloadd tmm1, [{b0} + {l}]",
            "tileloadd tmm2, [{b1} + {l}]",
            "tileloadd tmm7, [{b2} + {l}]",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tdpbssd tmm3, tmm0, tmm1",
            "tdpbssd tmm4, tmm0, tmm2",
            "tdpbssd tmm5, tmm0, tmm7",
            "tileloadd tmm1, [{b3} + {l}]",
            "tdpbssd tmm6, tmm0, tmm1",
            "tilestored [{c0} + {l}], tmm3",
            "tilestored [{c1} + {l}], tmm4",
            "tilestored [{c2} + {l}], tmm5",
            "tilestored [{c3} + {l}], tmm6",
            a0 = in(reg) a,
            b0 = in(reg) b[0],
            b1 = in(reg) b[1],
            b2 = in(reg) b[2],
            b3 = in(reg) b[3],
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            c2 = in(reg) c.add(32),
            c3 = in(reg) c.add(48),
            l = in(reg) 64usize,
            options(nostack, preserves_flags)
        );
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

    /// Whether `rows` are this group's width.
    pub(crate) fn fits(&self, rows: &AmxRows) -> bool {
        rows.k == self.blocks * QK && self.dtype.is_some()
    }

    /// `out[t][r] = W[r] · a[t]` for this group's sixteen rows and the
    /// tile's sixteen activation rows (or `+=` with `accumulate`, as
    /// `PackedRows::dot_group`).
    ///
    /// # Safety
    /// See the module; [`Unpacked::fits`] is true for `rows`.
    pub(crate) unsafe fn dot(
        &self,
        rows: &AmxRows,
        out: [&mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract; `rows` holds sixteen rows of
        // `self.blocks` blocks (`AmxRows::new`).
        unsafe {
            configure();
            match self.dtype {
                Some(DType::Q6K) => self.dot_quarters(rows, out, accumulate),
                Some(DType::Q4K) => self.dot_pairs::<-1>(rows, out, accumulate),
                Some(DType::Q4_1 | DType::Q5_1) => self.dot_pairs::<1>(rows, out, accumulate),
                _ => self.dot_pairs::<0>(rows, out, accumulate),
            }
        }
    }

    /// The 32-element types and Q4_K; `MIN`: how the block's min enters
    /// (`1`: `+ m · s_a`, `-1`: `- m · s_a`, `0`: not).
    ///
    /// Two C buffers in turn: step `i`'s tile products are issued before
    /// step `i - 1`'s f32 steps, so the tile unit works while the vector
    /// units finish the previous sums (each step alone waited on its
    /// loads and products, then on its f32 steps).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot_pairs<const MIN: i32>(
        &self,
        rows: &AmxRows,
        out: [&mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) {
        // Two steps' C tiles (lines): every one is stored before it is read.
        let mut c = std::mem::MaybeUninit::<[Line; 2 * 4 * 16]>::uninit();
        let c = c.as_mut_ptr().cast::<Line>();
        let (lines, a) = (self.lines.as_ptr(), rows.lines.as_ptr());
        let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
        // The previous step's first block, block count and C buffer.
        let mut pending: Option<(usize, usize, *const Line)> = None;
        let mut b0 = 0;
        while b0 < self.blocks {
            // Four blocks (two tile row pairs) a step, or the last two.
            let count = if b0 + 4 <= self.blocks { 4 } else { 2 };
            // Alternate buffers: `pending` reads the other one.
            let cp = c.wrapping_add(64 * ((b0 / 4) % 2));
            // SAFETY: tile row pair `b0 / 2`'s A tile is sixteen lines
            // from line `8 · b0` of `rows` (`AmxRows::new`), `b0 + count
            // <= blocks`; block `b`'s B tile is its own sixteen lines
            // (words, then zeros) for an even `b` and, for an odd one, the
            // eight zero lines before its words (see `Unpacked`); `cp`
            // holds four tiles.
            unsafe {
                let a = a.add(8 * b0);
                let b = |i: usize| lines.add(16 * (b0 + i) - 8 * (i % 2));
                if count == 4 {
                    four_blocks([a, a.add(16)], [b(0), b(1), b(2), b(3)], cp);
                } else {
                    two_blocks(a, [b(0), b(1)], cp);
                }
            }
            if let Some((first, n, sums)) = pending {
                // SAFETY: stored by the previous step (see below).
                unsafe { self.pair_sums::<MIN>(rows, first, n, sums, &mut acc) };
            }
            pending = Some((b0, count, cp));
            b0 += count;
        }
        if let Some((first, n, sums)) = pending {
            // SAFETY: `sums` holds the last step's `n` C tiles.
            unsafe { self.pair_sums::<MIN>(rows, first, n, sums, &mut acc) };
        }
        for (o, acc) in out.into_iter().zip(acc) {
            // SAFETY: `o` is sixteen f32.
            unsafe { store(o, acc, accumulate) };
        }
    }

    /// The f32 steps of blocks `first..first + count`, whose integer sums
    /// are the C tiles at `sums` (sixteen lines each), into `acc`: the VNNI
    /// kernels' steps one for one.
    ///
    /// # Safety
    /// `first + count <= self.blocks`; `sums` holds `count` stored tiles.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn pair_sums<const MIN: i32>(
        &self,
        rows: &AmxRows,
        first: usize,
        count: usize,
        sums: *const Line,
        acc: &mut [__m512; AMX_ROWS],
    ) {
        let (ds, ss) = (rows.d.as_ptr(), rows.s.as_ptr());
        for h in 0..count {
            let b = first + h;
            // SAFETY: b < self.blocks; tile h is sixteen lines at `sums`.
            let (scale, min, tile) = unsafe {
                (
                    _mm512_loadu_ps(self.scale.as_ptr().add(b).cast()),
                    _mm512_loadu_ps(self.min.as_ptr().add(b).cast()),
                    sums.add(16 * h).cast::<__m512i>(),
                )
            };
            for_each_row!(AMX_ROWS, t, {
                // SAFETY: row t's block b scales; line t of tile h.
                let (da, sa, isum) = unsafe {
                    (
                        *ds.add(AMX_ROWS * b + t),
                        *ss.add(AMX_ROWS * b + t),
                        _mm512_load_si512(tile.add(t)),
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

    /// Q6_K: four `tdpbssd` per tile row pair, one per 16-element half,
    /// in two C buffers as [`Unpacked::dot_pairs`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot_quarters(
        &self,
        rows: &AmxRows,
        out: [&mut [f32; GROUP_ROWS]; AMX_ROWS],
        accumulate: bool,
    ) {
        // Two pairs' C tiles (lines): every one is stored before it is read.
        let mut c = std::mem::MaybeUninit::<[Line; 2 * 4 * 16]>::uninit();
        let c = c.as_mut_ptr().cast::<Line>();
        let (lines, a) = (self.lines.as_ptr(), rows.lines.as_ptr());
        let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
        let mut pending: Option<(usize, *const Line)> = None;
        for p in 0..self.blocks / 2 {
            let cp = c.wrapping_add(64 * (p % 2));
            // SAFETY: as in `dot_pairs`; half `i` (of four) of the pair
            // starts at line `16 · (4p + i)`, its B tile `4i` lines before,
            // inside the previous half's zero lines (or at the first
            // half's own start for i = 0).
            unsafe {
                let half = |i: usize| lines.add(16 * (4 * p + i) - 4 * i);
                four_halves(a.add(16 * p), [half(0), half(1), half(2), half(3)], cp);
            }
            if let Some((q, sums)) = pending {
                // SAFETY: stored by the previous pair's step.
                unsafe { self.quarter_sums(rows, q, sums, &mut acc) };
            }
            pending = Some((p, cp));
        }
        if let Some((q, sums)) = pending {
            // SAFETY: the last pair's four tiles.
            unsafe { self.quarter_sums(rows, q, sums, &mut acc) };
        }
        for (o, acc) in out.into_iter().zip(acc) {
            // SAFETY: `o` is sixteen f32.
            unsafe { store(o, acc, accumulate) };
        }
    }

    /// Q6_K's f32 steps of tile row pair `p` (blocks `2p`, `2p + 1`),
    /// whose halves' integer sums are the four C tiles at `sums`.
    ///
    /// # Safety
    /// `2p + 1 < self.blocks`; `sums` holds four stored tiles.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter_sums(
        &self,
        rows: &AmxRows,
        p: usize,
        sums: *const Line,
        acc: &mut [__m512; AMX_ROWS],
    ) {
        let ds = rows.d.as_ptr();
        for h in 0..2 {
            let b = 2 * p + h;
            // SAFETY: b < self.blocks; tiles 2h, 2h + 1 at `sums`.
            let (d, sc0, sc1, s0, s1) = unsafe {
                let sc = self.sc.as_ptr().add(b).cast::<i32>();
                (
                    _mm512_loadu_ps(self.scale.as_ptr().add(b).cast()),
                    _mm512_loadu_si512(sc.cast()),
                    _mm512_loadu_si512(sc.add(GROUP_ROWS).cast()),
                    sums.add(32 * h).cast::<__m512i>(),
                    sums.add(32 * h + 16).cast::<__m512i>(),
                )
            };
            for_each_row!(AMX_ROWS, t, {
                // SAFETY: row t's block b scale; line t of both tiles.
                let (da, x0, x1) = unsafe {
                    (
                        *ds.add(AMX_ROWS * b + t),
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
}
