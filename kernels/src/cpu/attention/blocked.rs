//! A key block against every query of a tile at once (a prompt's tile:
//! its rows × the GQA group): the scores against the block's 32 keys and
//! the weighted sum of its 32 values as two small matrix products, each
//! key or value load shared by many queries held in registers.
//!
//! The per-row kernels (`scores`, `vecmath::weighted_sum_group`, `bf16`)
//! share a load among at most the four heads of one row, and every row
//! walks the whole block: at Gemma 3's 256 dimensions a widened block is
//! 64 KB, more than L1, so a prompt at depth was bound by loads from L2.
//! Here a key row serves up to [`SCORE_QUERIES`] queries and a value row
//! [`VALUE_QUERIES`], and the passes are ordered so that what they reread
//! stays in L1: a score chain reads only its own key rows (one cache line
//! each, a quarter of the keys), a value pass one column of 64 dimensions.
//!
//! Every result is bit for bit the per-row kernels': per query the same
//! chains in the same order (see `scores` and `bf16`), only which queries
//! share a load changes. A score's chains (dimensions `d ≡ c mod 4` in
//! f32, pair indices of one parity in BF16) run one after the other
//! instead of interleaved; each is the same sequential chain from 0.
//!
//! Layouts: queries chain-major, `[chain][query][i]` ([`pack_f32`],
//! [`pack_bf16`]); scores and probabilities `[query][KEY_BLOCK]`; outputs
//! `[query][head_dim]` (the tile's state).

use super::bf16::{dot2, Bf16Isa, Products};
#[cfg(target_arch = "x86_64")]
use super::blocked_amx as amx;
use super::blocked_span;
use crate::cpu::isa::CheckedIsa;
use crate::cpu::kv_layout::{KEY_BLOCK, KEY_TILE};
#[cfg(target_arch = "x86_64")]
use crate::cpu::Isa;

/// Queries a score pass keeps in registers: two accumulators each (one
/// per key tile), 24 of the 32.
pub(super) const SCORE_QUERIES: usize = 12;
/// Queries a value pass keeps in registers: four vectors of sixteen
/// dimensions each, 24 accumulators.
pub(super) const VALUE_QUERIES: usize = 6;
use shape::{CHAINS_BF16, CHAINS_F32, COLUMN};

/// How the passes split their work, in a module of its own so the x86
/// kernels read the same numbers without reaching back into their parent.
mod shape {
    /// Dimensions of a value pass: the column of the block it rereads.
    pub(super) const COLUMN: usize = 64;
    /// f32 score chains (`scores`): dimensions `d ≡ c (mod 4)`.
    pub(super) const CHAINS_F32: usize = 4;
    /// BF16 score chains (`bf16`): pair indices of each parity.
    pub(super) const CHAINS_BF16: usize = 2;
}

/// Whether the blocked kernels run fast here for `products`: AVX-512 for
/// f32, AVX-512 BF16 for BF16. Elsewhere the per-row kernels do as well
/// (the scalar twins below are for tests).
pub(super) fn fast(isa: CheckedIsa, bf16: Option<Bf16Isa>) -> bool {
    match bf16 {
        Some(b) => b.simd(),
        #[cfg(target_arch = "x86_64")]
        None => matches!(isa.get(), Isa::Avx512 | Isa::Avx512Vnni),
        #[cfg(not(target_arch = "x86_64"))]
        None => {
            let _ = isa;
            false
        }
    }
}

/// Query rows of a prompt tile on AMX: every key block a tile reads
/// (converted to BF16 pairs once per tile) then serves 32 rows' queries,
/// four times the per-row kernels' eight.
const AMX_TILE_ROWS: usize = 32;

/// The products a sequence's rows take in a call, and its tile's rows
/// where they are not the per-row kernels' (`None`). A prompt's rows
/// (`AttentionRows::prompt`, a chunk of any length) take BF16 on AMX
/// tiles wherever AMX takes `head_dim` (`blocked_span::takes`), walked in
/// spans at fixed positions (`stream::run_amx`), so a prompt row's result
/// does not depend on its chunk. Decode and speculative-verify rows never
/// take AMX, whose sums are not `vdpbf16ps`'s bits: f32 under
/// `bf16-prompt` and `bf16x3` (split operands, `bf16x3`), `vdpbf16ps`
/// under `bf16`, so greedy output with and without speculation stays the
/// same. Where AMX does not take a prompt's rows, `bf16-prompt` and
/// `bf16x3` are f32 for every row.
pub(super) fn for_rows(
    products: Products,
    prompt: bool,
    head_dim: usize,
) -> (Products, Option<usize>) {
    match products {
        Products::Bf16(b) if prompt && blocked_span::takes(b, head_dim) => {
            (products, Some(amx_rows()))
        }
        Products::Bf16(b) if b.prompt_only() => (Products::F32, None),
        Products::Bf16(b) => (Products::Bf16(b.without_amx()), None),
        Products::F32 => (products, None),
    }
}

/// Rows of an AMX tile in a layer without a window ([`AMX_TILE_ROWS`]);
/// `SWITCHYARD_AMX_ROWS` overrides it (to measure).
fn amx_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&ROWS, "SWITCHYARD_AMX_ROWS", AMX_TILE_ROWS, |r| r > 0)
}

/// Elements of one query's chain in [`pack_f32`]'s layout.
fn chain_len(len: usize, chains: usize) -> usize {
    len.div_ceil(chains)
}

/// `queries` (`n` of `head_dim`, query `qi` at `query(qi)`) chain-major:
/// element `i` of chain `c` of query `qi` (dimension `4i + c`) at
/// `(c · n + qi) · head_dim.div_ceil(4) + i`, 0 past the query.
pub(super) fn pack_f32<'q>(
    query: impl Fn(usize) -> &'q [f32],
    n: usize,
    head_dim: usize,
    out: &mut Vec<f32>,
) {
    let len = chain_len(head_dim, CHAINS_F32);
    out.clear();
    out.resize(CHAINS_F32 * n * len, 0.0);
    for qi in 0..n {
        for (d, x) in query(qi).iter().enumerate().take(head_dim) {
            out[((d % CHAINS_F32) * n + qi) * len + d / CHAINS_F32] = *x;
        }
    }
}

/// Queries of a BF16 chain: `n` rounded up to whole AMX tiles (rows past
/// `n` are 0), so that a tile of sixteen query rows never reads past the
/// chain.
fn padded(n: usize) -> usize {
    n.next_multiple_of(QUERY_ROWS)
}

/// Rows of an AMX tile ([`padded`]).
const QUERY_ROWS: usize = 16;

/// BF16 queries (`n` of `pairs` pairs, query-major as `bf16::pack_in_order`
/// leaves them) chain-major: pair `2i + c` of query `qi` at
/// `(c · padded(n) + qi) · pairs.div_ceil(2) + i`.
pub(super) fn pack_bf16(q_pairs: &[u32], n: usize, pairs: usize, out: &mut Vec<u32>) {
    let len = chain_len(pairs, CHAINS_BF16);
    let rows = padded(n);
    out.clear();
    out.resize(CHAINS_BF16 * rows * len, 0);
    for qi in 0..n {
        for p in 0..pairs {
            out[((p % CHAINS_BF16) * rows + qi) * len + p / CHAINS_BF16] = q_pairs[qi * pairs + p];
        }
    }
}

/// `out[qi · KEY_BLOCK + j] = scale · (q_qi · key_j)` for the `n` queries
/// `qc` (packed by [`pack_f32`]) and the block's two key tiles (`keys`:
/// `2 · KEY_TILE · head_dim`, dimension-major); `part` is scratch. Bit for
/// bit `scores::scores16` per query and tile.
pub(super) fn scores_f32(
    isa: CheckedIsa,
    qc: &[f32],
    (n, head_dim): (usize, usize),
    keys: &[f32],
    scale: f32,
    part: &mut Vec<f32>,
    out: &mut [f32],
) {
    let len = chain_len(head_dim, CHAINS_F32);
    let keys = &keys[..2 * KEY_TILE * head_dim];
    let qc = &qc[..CHAINS_F32 * n * len];
    part.clear();
    part.resize(CHAINS_F32 * n * KEY_BLOCK, 0.0);
    for c in 0..CHAINS_F32.min(head_dim) {
        // Dimensions c, c + 4, … below head_dim.
        let steps = (head_dim - c).div_ceil(CHAINS_F32);
        for q0 in (0..n).step_by(SCORE_QUERIES) {
            let m = (n - q0).min(SCORE_QUERIES);
            let q = &qc[(c * n + q0) * len..];
            let to = &mut part[(c * n + q0) * KEY_BLOCK..(c * n + q0 + m) * KEY_BLOCK];
            chain_f32(
                isa,
                (q, len),
                m,
                steps,
                (&keys[c * KEY_TILE..], head_dim),
                to,
            );
        }
    }
    let (p, rest) = part.split_at(n * KEY_BLOCK);
    let (p1, rest) = rest.split_at(n * KEY_BLOCK);
    let (p2, p3) = rest.split_at(n * KEY_BLOCK);
    for ((((o, a), b), c), d) in out[..n * KEY_BLOCK]
        .iter_mut()
        .zip(p)
        .zip(p1)
        .zip(p2)
        .zip(p3)
    {
        *o = ((a + b) + (c + d)) * scale;
    }
}

/// One chain of `m` queries (`q`: query `g`'s elements at `g · stride`)
/// over `steps` key rows of both tiles (`keys`: the chain's first row;
/// rows `CHAINS_F32` apart, the second tile `KEY_TILE · head_dim` on):
/// `to[g · KEY_BLOCK + j]`.
fn chain_f32(
    isa: CheckedIsa,
    (q, stride): (&[f32], usize),
    m: usize,
    steps: usize,
    (keys, head_dim): (&[f32], usize),
    to: &mut [f32],
) {
    let row = |i: usize| i * CHAINS_F32 * KEY_TILE;
    let second = KEY_TILE * head_dim;
    match isa.get() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni if m > 0 && steps > 0 && stride >= steps => {
            // Cut to the last element the kernel reads or writes.
            let q = &q[..(m - 1) * stride + steps];
            let keys = &keys[..second + row(steps - 1) + KEY_TILE];
            let to = &mut to[..m * KEY_BLOCK];
            let args = (
                q.as_ptr(),
                stride,
                steps,
                keys.as_ptr(),
                second,
                to.as_mut_ptr(),
            );
            // SAFETY: CheckedIsa guarantees AVX-512 F; the kernel reads and
            // writes inside the slices cut above.
            unsafe {
                match m {
                    1 => x86::chain_f32::<1>(args),
                    2 => x86::chain_f32::<2>(args),
                    3 => x86::chain_f32::<3>(args),
                    4 => x86::chain_f32::<4>(args),
                    5 => x86::chain_f32::<5>(args),
                    6 => x86::chain_f32::<6>(args),
                    7 => x86::chain_f32::<7>(args),
                    8 => x86::chain_f32::<8>(args),
                    9 => x86::chain_f32::<9>(args),
                    10 => x86::chain_f32::<10>(args),
                    11 => x86::chain_f32::<11>(args),
                    _ => x86::chain_f32::<12>(args),
                }
            }
        }
        _ => {
            for g in 0..m {
                for j in 0..KEY_BLOCK {
                    let at = (j / KEY_TILE) * second + j % KEY_TILE;
                    to[g * KEY_BLOCK + j] = (0..steps).fold(0.0f32, |a, i| {
                        q[g * stride + i].mul_add(keys[at + row(i)], a)
                    });
                }
            }
        }
    }
}

/// [`scores_f32`] in BF16: the `n` queries `qb` ([`pack_bf16`]) against
/// the block's key pairs (`keys`: two tiles of `pairs · KEY_TILE`, as
/// `bf16::pack_key_tile`). Bit for bit `bf16::scores` per query.
pub(super) fn scores_bf16(
    b: Bf16Isa,
    qb: &[u32],
    shape: (usize, usize),
    keys: &[u32],
    scale: f32,
    part: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores_bf16_on(b, amx(b), qb, shape, keys, scale, part, out);
}

/// Whether the AMX kernels (`blocked_amx`) take the BF16 products of `b`.
fn amx(b: Bf16Isa) -> bool {
    b.amx()
}

/// Whether the AMX score kernel takes `pairs` pairs a query: whole tile
/// rows of sixteen pairs in each chain (head sizes that are multiples of
/// 64; the others keep `vdpbf16ps`).
fn amx_pairs(pairs: usize) -> bool {
    pairs > 0 && pairs.is_multiple_of(CHAINS_BF16 * QUERY_ROWS)
}

/// [`scores_bf16`] with the choice of AMX made (`use_amx`, which needs
/// [`amx`]'s answer true): the tests run both kernels on one host.
#[allow(clippy::too_many_arguments)]
fn scores_bf16_on(
    b: Bf16Isa,
    use_amx: bool,
    qb: &[u32],
    (n, pairs): (usize, usize),
    keys: &[u32],
    scale: f32,
    part: &mut Vec<f32>,
    out: &mut [f32],
) {
    let len = chain_len(pairs, CHAINS_BF16);
    let rows = padded(n);
    let keys = &keys[..2 * KEY_TILE * pairs];
    let qb = &qb[..CHAINS_BF16 * rows * len];
    part.clear();
    part.resize(CHAINS_BF16 * rows * KEY_BLOCK, 0.0);
    match use_amx && amx_pairs(pairs) {
        // SAFETY: `use_amx` is true only where `amx` was (AMX granted);
        // `qb` holds both chains of `rows` queries of `len` pairs, `keys`
        // both tiles of `pairs = 2 · len` pair rows, `part` both chains'
        // `rows` score rows (all cut or sized above).
        #[cfg(target_arch = "x86_64")]
        true => unsafe { amx::scores(qb.as_ptr(), (rows, len), keys.as_ptr(), part.as_mut_ptr()) },
        _ => {
            for c in 0..CHAINS_BF16.min(pairs) {
                let steps = (pairs - c).div_ceil(CHAINS_BF16);
                for q0 in (0..n).step_by(SCORE_QUERIES) {
                    let m = (n - q0).min(SCORE_QUERIES);
                    let q = &qb[(c * rows + q0) * len..];
                    let to =
                        &mut part[(c * rows + q0) * KEY_BLOCK..(c * rows + q0 + m) * KEY_BLOCK];
                    chain_bf16(b, (q, len), m, steps, (&keys[c * KEY_TILE..], pairs), to);
                }
            }
        }
    }
    let (c0, c1) = part.split_at(rows * KEY_BLOCK);
    for ((o, a), b) in out[..n * KEY_BLOCK].iter_mut().zip(c0).zip(c1) {
        *o = (a + b) * scale;
    }
}

/// [`chain_f32`] in BF16 pairs: key rows `CHAINS_BF16` pairs apart.
fn chain_bf16(
    b: Bf16Isa,
    (q, stride): (&[u32], usize),
    m: usize,
    steps: usize,
    (keys, pairs): (&[u32], usize),
    to: &mut [f32],
) {
    let row = |i: usize| i * CHAINS_BF16 * KEY_TILE;
    let second = KEY_TILE * pairs;
    match b.simd() {
        #[cfg(target_arch = "x86_64")]
        true if m > 0 && steps > 0 && stride >= steps => {
            let q = &q[..(m - 1) * stride + steps];
            let keys = &keys[..second + row(steps - 1) + KEY_TILE];
            let to = &mut to[..m * KEY_BLOCK];
            let args = (
                q.as_ptr(),
                stride,
                steps,
                keys.as_ptr(),
                second,
                to.as_mut_ptr(),
            );
            // SAFETY: `simd` is set only where AVX-512 BF16 was detected;
            // the kernel reads and writes inside the slices cut above.
            unsafe {
                match m {
                    1 => x86::chain_bf16::<1>(args),
                    2 => x86::chain_bf16::<2>(args),
                    3 => x86::chain_bf16::<3>(args),
                    4 => x86::chain_bf16::<4>(args),
                    5 => x86::chain_bf16::<5>(args),
                    6 => x86::chain_bf16::<6>(args),
                    7 => x86::chain_bf16::<7>(args),
                    8 => x86::chain_bf16::<8>(args),
                    9 => x86::chain_bf16::<9>(args),
                    10 => x86::chain_bf16::<10>(args),
                    11 => x86::chain_bf16::<11>(args),
                    _ => x86::chain_bf16::<12>(args),
                }
            }
        }
        _ => {
            for g in 0..m {
                for j in 0..KEY_BLOCK {
                    let at = (j / KEY_TILE) * second + j % KEY_TILE;
                    to[g * KEY_BLOCK + j] = (0..steps)
                        .fold(0.0f32, |a, i| dot2(a, q[g * stride + i], keys[at + row(i)]));
                }
            }
        }
    }
}

/// `acc[qi · head_dim + d] += Σ_j p[qi · KEY_BLOCK + j] · values[j ·
/// head_dim + d]` for the `n` queries, one fused multiply-add per term in
/// order of `j` (bit for bit `vecmath::weighted_sum`).
pub(super) fn weighted_f32(
    isa: CheckedIsa,
    p: &[f32],
    (n, head_dim): (usize, usize),
    values: &[f32],
    acc: &mut [f32],
) {
    let (p, values) = (&p[..n * KEY_BLOCK], &values[..KEY_BLOCK * head_dim]);
    let acc = &mut acc[..n * head_dim];
    for c0 in (0..head_dim).step_by(COLUMN) {
        for q0 in (0..n).step_by(VALUE_QUERIES) {
            let m = (n - q0).min(VALUE_QUERIES);
            match isa.get() {
                // SAFETY: CheckedIsa guarantees AVX-512 F; `p` holds the
                // `m` rows from `q0`, `acc` their outputs, `values` the
                // block's rows (cut above); the kernel masks at `head_dim`.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 | Isa::Avx512Vnni => unsafe {
                    let args = (
                        p.as_ptr().add(q0 * KEY_BLOCK),
                        values.as_ptr(),
                        acc.as_mut_ptr().add(q0 * head_dim),
                        head_dim,
                        c0,
                    );
                    match m {
                        1 => x86::weighted_f32::<1>(args),
                        2 => x86::weighted_f32::<2>(args),
                        3 => x86::weighted_f32::<3>(args),
                        4 => x86::weighted_f32::<4>(args),
                        5 => x86::weighted_f32::<5>(args),
                        _ => x86::weighted_f32::<6>(args),
                    }
                },
                _ => {
                    for qi in q0..q0 + m {
                        for d in c0..(c0 + COLUMN).min(head_dim) {
                            let a = &mut acc[qi * head_dim + d];
                            for j in 0..KEY_BLOCK {
                                *a = p[qi * KEY_BLOCK + j].mul_add(values[j * head_dim + d], *a);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// [`weighted_f32`] in BF16 pairs: `p` (`n` rows of `KEY_BLOCK / 2` pairs
/// of probabilities) against `values` (`KEY_BLOCK / 2` rows of `head_dim`
/// pairs of positions, as `bf16::pack` makes them); bit for bit
/// `bf16::weighted_sum`.
pub(super) fn weighted_bf16(
    b: Bf16Isa,
    p: &[u32],
    shape: (usize, usize),
    values: &[u32],
    acc: &mut [f32],
) {
    weighted_bf16_on(b, amx(b), p, shape, values, acc);
}

/// [`weighted_bf16`] with the choice of AMX made (as [`scores_bf16_on`]):
/// AMX takes the whole tiles of sixteen queries, `vdpbf16ps` the rest.
fn weighted_bf16_on(
    b: Bf16Isa,
    use_amx: bool,
    p: &[u32],
    (n, head_dim): (usize, usize),
    values: &[u32],
    acc: &mut [f32],
) {
    const ROWS: usize = KEY_BLOCK / 2;
    let (p, values) = (&p[..n * ROWS], &values[..ROWS * head_dim]);
    let acc = &mut acc[..n * head_dim];
    let from = match use_amx && head_dim.is_multiple_of(QUERY_ROWS) {
        // SAFETY: `use_amx` is true only where `amx` was (AMX granted);
        // `p` holds the `16 · blocks` queries' 16 pairs, `values` 16 rows
        // of `head_dim`, `acc` their outputs (cut above).
        #[cfg(target_arch = "x86_64")]
        true => unsafe {
            let blocks = n / QUERY_ROWS;
            amx::weighted(
                p.as_ptr(),
                blocks,
                values.as_ptr(),
                head_dim,
                acc.as_mut_ptr(),
            );
            blocks * QUERY_ROWS
        },
        _ => 0,
    };
    for c0 in (0..head_dim).step_by(COLUMN) {
        for q0 in (from..n).step_by(VALUE_QUERIES) {
            let m = (n - q0).min(VALUE_QUERIES);
            match b.simd() {
                // SAFETY: `simd` is set only where AVX-512 BF16 was
                // detected; the lengths as in `weighted_f32` (cut above).
                #[cfg(target_arch = "x86_64")]
                true => unsafe {
                    let args = (
                        p.as_ptr().add(q0 * ROWS),
                        values.as_ptr(),
                        acc.as_mut_ptr().add(q0 * head_dim),
                        head_dim,
                        c0,
                    );
                    match m {
                        1 => x86::weighted_bf16::<1>(args),
                        2 => x86::weighted_bf16::<2>(args),
                        3 => x86::weighted_bf16::<3>(args),
                        4 => x86::weighted_bf16::<4>(args),
                        5 => x86::weighted_bf16::<5>(args),
                        _ => x86::weighted_bf16::<6>(args),
                    }
                },
                _ => {
                    for qi in q0..q0 + m {
                        for d in c0..(c0 + COLUMN).min(head_dim) {
                            let a = &mut acc[qi * head_dim + d];
                            for r in 0..ROWS {
                                *a = dot2(*a, p[qi * ROWS + r], values[r * head_dim + d]);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "blocked_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "blocked_tests.rs"]
mod tests;
