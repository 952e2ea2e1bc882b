//! The blocked BF16 products on AMX tiles (`tdpbf16ps`: a 16×16 block of
//! f32 sums gains sixteen pair products each in one instruction, 8,192
//! multiply-adds, where `vdpbf16ps` does 32), for the BF16 precision's
//! long prompt chunks on CPUs with AMX-BF16 (Intel Sapphire Rapids and
//! later).
//!
//! The operands are the layouts `blocked` already packs for `vdpbf16ps`:
//! a score chain's queries (rows of sixteen pairs), the key tiles' pair
//! rows (every second one is the chain's), the probabilities' pairs and
//! the value pairs; a score is still two chains (two tiles) summed, an
//! output one sum over the block's pairs from its running value.
//!
//! The inputs round to BF16 exactly as `vdpbf16ps`'s do, but the sums do
//! not: `tdpbf16ps` adds a tile row's sixteen pairs its own way (not
//! `bf16::dot2`'s order of single roundings, nor one rounding per pair:
//! measured on Emerald Rapids, about half of such sums differ in their
//! last bits). The results are the chains' within the f32 rounding of
//! sums of that length (`blocked_tests`), so `blocked` gives AMX only a
//! prompt chunk's rows, never a decode or speculative step's.
//!
//! Whether AMX may run, and the tile configuration, are `cpu::amx`'s;
//! where it may not, [`available`] is false and `vdpbf16ps` runs.
//!
//! Rust's AMX intrinsics are unstable; the instructions go through
//! `asm!`. Every tile is configured 16 rows of 64 bytes, once per thread.
//!
//! # Safety
//! The kernels need [`available`] to have returned true, and pointers
//! valid for the reads and writes each one names.

use std::arch::asm;

use crate::cpu::amx::configure;
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};

/// Pairs along a tile row (64 bytes), and rows of a tile.
pub(super) const TILE: usize = 16;

/// Whether the AMX kernels may run in this process (see `cpu::amx`).
pub(crate) fn available() -> bool {
    crate::cpu::amx::bf16_available()
}

// One instruction each; tile numbers are immediates. Every block keeps
// its side effects, so their order is kept.
macro_rules! zero {
    ($t:literal) => {
        asm!(
            concat!("tilezero tmm", $t),
            options(nostack, nomem, preserves_flags)
        )
    };
}
macro_rules! load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}]"),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, readonly, preserves_flags)
        )
    };
}
macro_rules! store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tilestored [{p} + {s}], tmm", $t),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, preserves_flags)
        )
    };
}
macro_rules! dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// Both score chains of `n_pad` queries (a multiple of [`TILE`]) against
/// a block's two key tiles: `part[(c · n_pad + qi) · KEY_BLOCK + j]` =
/// chain `c` of query `qi` and key `j`, from 0 (sixteen pairs a
/// `tdpbf16ps`).
///
/// `qb`: the chains as `blocked::pack_bf16` packs them, chain `c` of
/// query `qi` at `(c · n_pad + qi) · len` (`len`, a multiple of
/// [`TILE`], pairs each); `keys`: two tiles of `pairs · KEY_TILE` pairs
/// (`pairs = 2 · len`), pair `p` of key `j` at `p · KEY_TILE + j`.
///
/// # Safety
/// See the module; `qb` holds `2 · n_pad · len` pairs, `keys`
/// `2 · pairs · KEY_TILE`, `part` `2 · n_pad · KEY_BLOCK` floats.
pub(super) unsafe fn scores(
    qb: *const u32,
    (n_pad, len): (usize, usize),
    keys: *const u32,
    part: *mut f32,
) {
    // SAFETY: the caller checked `available`.
    unsafe { configure() };
    let a_stride = len * 4;
    // A chain's pair rows are every second one of a key tile.
    let b_stride = 2 * KEY_TILE * 4;
    let c_stride = KEY_BLOCK * 4;
    let second = 2 * len * KEY_TILE;
    for c in 0..2 {
        let mut q0 = 0;
        while q0 < n_pad {
            let two = q0 + 2 * TILE <= n_pad;
            let a = qb.wrapping_add((c * n_pad + q0) * len);
            let out = part.wrapping_add((c * n_pad + q0) * KEY_BLOCK);
            // SAFETY: every row read or written is inside the ranges the
            // caller vouches for: query rows q0.. q0 + 16 (or 32) of chain
            // c, pair rows c + 32s + 2r < pairs of each key tile.
            unsafe {
                zero!(0);
                zero!(1);
                if two {
                    zero!(4);
                    zero!(5);
                }
                for s in 0..len / TILE {
                    let b = keys.wrapping_add((c + 2 * TILE * s) * KEY_TILE);
                    load!(2, a.wrapping_add(TILE * s), a_stride);
                    load!(6, b, b_stride);
                    load!(7, b.wrapping_add(second), b_stride);
                    dot!(0, 2, 6);
                    dot!(1, 2, 7);
                    if two {
                        load!(3, a.wrapping_add(TILE * len + TILE * s), a_stride);
                        dot!(4, 3, 6);
                        dot!(5, 3, 7);
                    }
                }
                store!(0, out, c_stride);
                store!(1, out.wrapping_add(KEY_TILE), c_stride);
                if two {
                    let out = out.wrapping_add(TILE * KEY_BLOCK);
                    store!(4, out, c_stride);
                    store!(5, out.wrapping_add(KEY_TILE), c_stride);
                }
            }
            q0 += if two { 2 * TILE } else { TILE };
        }
    }
}

/// `acc[qi · hd + d] += Σ_r p[qi · 16 + r] · values[r · hd + d]` in
/// pairs, for the `16 · blocks` queries from 0 and `hd` (a multiple of
/// [`TILE`]) dimensions: each element one `tdpbf16ps` sum over the
/// sixteen position pairs from its running value.
///
/// # Safety
/// See the module; `p` holds `16 · blocks · 16` pairs, `values`
/// `16 · hd`, `acc` `16 · blocks · hd` floats.
pub(super) unsafe fn weighted(
    p: *const u32,
    blocks: usize,
    values: *const u32,
    hd: usize,
    acc: *mut f32,
) {
    const ROWS: usize = KEY_BLOCK / 2;
    // SAFETY: the caller checked `available`.
    unsafe { configure() };
    let a_stride = ROWS * 4;
    let row = hd * 4;
    let mut qb = 0;
    while qb < blocks {
        let two = qb + 2 <= blocks;
        let a = p.wrapping_add(qb * TILE * ROWS);
        let c = acc.wrapping_add(qb * TILE * hd);
        let c2 = c.wrapping_add(TILE * hd);
        // SAFETY: rows of query blocks qb (and qb + 1 when `two`) and
        // columns d0..d0 + 16 < hd, inside the caller's ranges.
        unsafe {
            load!(2, a, a_stride);
            if two {
                load!(3, a.wrapping_add(TILE * ROWS), a_stride);
            }
            for d0 in (0..hd).step_by(TILE) {
                load!(6, values.wrapping_add(d0), row);
                load!(0, c.wrapping_add(d0), row);
                dot!(0, 2, 6);
                if two {
                    load!(1, c2.wrapping_add(d0), row);
                    dot!(1, 3, 6);
                }
                store!(0, c.wrapping_add(d0), row);
                if two {
                    store!(1, c2.wrapping_add(d0), row);
                }
            }
        }
        qb += if two { 2 } else { 1 };
    }
}

/// Scores of one or two groups of sixteen queries (`two`) against a span's
/// `key_tiles` key tiles (an even count), each sum over all of a query's
/// `pairs` pairs in one tile (`blocked_span`): `out[qi · keys + j]`
/// (`keys = key_tiles · KEY_TILE`), unscaled.
///
/// `q`: the queries in order, query `qi`'s pair `p` at `qi · pairs + p`
/// (`pairs` a multiple of [`TILE`]); `k`: the key tiles one after another,
/// pair `p` of key `j` of tile `t` at `(t · pairs + p) · KEY_TILE + j`.
///
/// # Safety
/// See the module; `q` holds `16 · (1 + two)` queries, `k` `key_tiles`
/// tiles, `out` `16 · (1 + two)` rows of `keys` floats.
pub(super) unsafe fn span_scores(
    (q, two): (*const u32, bool),
    pairs: usize,
    (k, key_tiles): (*const u32, usize),
    out: *mut f32,
) {
    // SAFETY: the caller checked `available`.
    unsafe { configure() };
    let a_stride = pairs * 4;
    let b_stride = KEY_TILE * 4;
    let keys = key_tiles * KEY_TILE;
    let c_stride = keys * 4;
    let tile_len = pairs * KEY_TILE;
    let q1 = q.wrapping_add(TILE * pairs);
    let out1 = out.wrapping_add(TILE * keys);
    for t in (0..key_tiles).step_by(2) {
        let k0 = k.wrapping_add(t * tile_len);
        let k1 = k0.wrapping_add(tile_len);
        // SAFETY: query rows 0..16 (32 when `two`), pair columns
        // 16s..16s + 16 < pairs, key tiles t and t + 1 < key_tiles, score
        // rows and columns inside `out`: the caller's ranges.
        unsafe {
            zero!(0);
            zero!(1);
            if two {
                zero!(2);
                zero!(3);
            }
            for s in 0..pairs / TILE {
                load!(4, q.wrapping_add(TILE * s), a_stride);
                load!(6, k0.wrapping_add(TILE * KEY_TILE * s), b_stride);
                load!(7, k1.wrapping_add(TILE * KEY_TILE * s), b_stride);
                dot!(0, 4, 6);
                dot!(1, 4, 7);
                if two {
                    load!(5, q1.wrapping_add(TILE * s), a_stride);
                    dot!(2, 5, 6);
                    dot!(3, 5, 7);
                }
            }
            store!(0, out.wrapping_add(t * KEY_TILE), c_stride);
            store!(1, out.wrapping_add((t + 1) * KEY_TILE), c_stride);
            if two {
                store!(2, out1.wrapping_add(t * KEY_TILE), c_stride);
                store!(3, out1.wrapping_add((t + 1) * KEY_TILE), c_stride);
            }
        }
    }
}

/// `acc[qi · hd + d] += Σ_r p[qi · rows + r] · values[r · hd + d]` for
/// one or two groups of sixteen queries (`two`) over a span's `rows` pair
/// rows of positions (a multiple of [`TILE`]) and `hd` dimensions (a
/// multiple of 32): each output tile read and written once per span.
///
/// # Safety
/// See the module; `p` holds `16 · (1 + two)` rows of `rows` pairs,
/// `values` `rows` rows of `hd` pairs, `acc` `16 · (1 + two)` rows of `hd`.
pub(super) unsafe fn span_weighted(
    (p, two): (*const u32, bool),
    rows: usize,
    (values, hd): (*const u32, usize),
    acc: *mut f32,
) {
    // SAFETY: the caller checked `available`.
    unsafe { configure() };
    let a_stride = rows * 4;
    let row = hd * 4;
    let p1 = p.wrapping_add(TILE * rows);
    let acc1 = acc.wrapping_add(TILE * hd);
    for d0 in (0..hd).step_by(2 * TILE) {
        // SAFETY: query rows 0..16 (32 when `two`), pair rows
        // 16r..16r + 16 < rows, columns d0..d0 + 32 <= hd: the caller's
        // ranges.
        unsafe {
            load!(0, acc.wrapping_add(d0), row);
            load!(1, acc.wrapping_add(d0 + TILE), row);
            if two {
                load!(2, acc1.wrapping_add(d0), row);
                load!(3, acc1.wrapping_add(d0 + TILE), row);
            }
            for r in 0..rows / TILE {
                let v = values.wrapping_add(TILE * r * hd + d0);
                load!(4, p.wrapping_add(TILE * r), a_stride);
                load!(6, v, row);
                load!(7, v.wrapping_add(TILE), row);
                dot!(0, 4, 6);
                dot!(1, 4, 7);
                if two {
                    load!(5, p1.wrapping_add(TILE * r), a_stride);
                    dot!(2, 5, 6);
                    dot!(3, 5, 7);
                }
            }
            store!(0, acc.wrapping_add(d0), row);
            store!(1, acc.wrapping_add(d0 + TILE), row);
            if two {
                store!(2, acc1.wrapping_add(d0), row);
                store!(3, acc1.wrapping_add(d0 + TILE), row);
            }
        }
    }
}
