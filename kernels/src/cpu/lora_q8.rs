//! Q8_0 LoRA adapters on integer dot products: the shrink and the expand
//! of `lora` for adapter matrices held in Q8_0, each side in its own
//! layout (`Backend::lora_matrix` packs them once, at upload), so that
//! both halves run on VNNI's `vpdpbusd` (64 int8 products a cycle) instead
//! of widening every weight to f32 first, which made Q8_0 adapters no
//! faster than BF16 at half the bytes.
//!
//! - **Shrink** (`A`, `rank × in`): each row of `x` is quantized as the
//!   base's Q8_0 matmuls quantize activations (`quant_act`: blocks of 32,
//!   `d = amax / 127`), so block `b` of a rank row `j` sums as
//!   `d_A(j, b) · d_x(b) · Σ q_A · q_x`, exactly in the integers.
//! - **Expand** (`Bᵀ`, `rank × out`): the row's `rank` intermediate values
//!   are quantized once (one scale over all of them), and `Bᵀ` is
//!   requantized at upload so that each group of four rank rows shares one
//!   scale per block of 32 columns (still a Q8_0 matrix, whose four row
//!   scales are equal), so four terms of `Σⱼ p_j · Bᵀ(j, c)` sum in the
//!   integers and take one f32 multiply-add per group.
//!
//! The layout: the rank rows are padded with zero rows to a multiple of 4
//! (a zero row adds exactly nothing), and the matrix is cut into units of
//! four rank rows × one block of 32 columns, unit `(b, g)` at
//! `UNIT · (b · groups + g)`: 128 bytes of quants, stored `q + 128` as the
//! unsigned operand of `vpdpbusd`, then the four rows' f16 scales. In
//! the shrink's unit, byte `64h + 4l + t` is row `4g + l / 4`, column
//! `32b + 16h + 4(l % 4) + t` (a 32-bit lane holds four consecutive
//! columns of one row, and one broadcast of 16 bytes of `x` feeds every
//! lane); in the expand's, row `4g + t`, column `32b + 16h + l` (a lane
//! holds one column of four rows). A unit is the bytes of four Q8_0
//! blocks, so the matrix keeps Q8_0's size.
//!
//! The scalar twins below define the results: the SIMD kernels do the same
//! integer sums and the same f32 operations in the same order, so they
//! give the same bits. Against the f32 arithmetic on the stored values the
//! difference is the activations' (and the intermediate values')
//! quantization: see the tolerances in the tests.

use super::isa::{CheckedIsa, Isa};
use super::lora_q8_operands::{QuantMid, QuantRow, QUAD, UNIT};
use super::quant_act::quantize_blocks;
use crate::formats::blocks::{f16_at, QK};
use crate::{KernelError, LoraSide as Side, WeightView};

/// A Q8_0 `rows × cols` matrix (rows one after another) in `side`'s
/// layout, its rows padded to a multiple of [`QUAD`].
pub(crate) fn pack(side: Side, weight: &WeightView) -> Result<WeightView, KernelError> {
    let (rows, cols) = (weight.rows, weight.cols);
    let padded = rows.div_ceil(QUAD) * QUAD;
    let mut values = vec![0.0f32; padded * cols];
    let row_bytes = weight.data.len().checked_div(rows).unwrap_or(0);
    for (row, out) in weight
        .data
        .chunks_exact(row_bytes.max(1))
        .zip(values.chunks_exact_mut(cols.max(1)))
    {
        crate::formats::dequantize_row(weight.dtype, row, out)?;
    }
    let (blocks, groups) = (cols / QK, padded / QUAD);
    let mut data = vec![0u8; blocks * groups * UNIT];
    for b in 0..blocks {
        for g in 0..groups {
            let unit = &mut data[UNIT * (b * groups + g)..][..UNIT];
            let value = |t: usize, c: usize| values[(QUAD * g + t) * cols + QK * b + c];
            let mut scales = [0.0f32; QUAD];
            match side {
                // The rows' own Q8_0 scales: the values unchanged.
                Side::Shrink => {
                    for (t, s) in scales.iter_mut().enumerate() {
                        let row = &weight.data[..];
                        *s = if QUAD * g + t < rows {
                            f16_at(row, (QUAD * g + t) * row_bytes + 34 * b)
                        } else {
                            0.0
                        };
                    }
                }
                // One scale for the four rows' block.
                Side::Expand => {
                    let amax = (0..QUAD)
                        .flat_map(|t| (0..QK).map(move |c| (t, c)))
                        .fold(0.0f32, |m, (t, c)| m.max(value(t, c).abs()));
                    let d = half::f16::from_f32(amax / 127.0).to_f32();
                    scales = [d; QUAD];
                }
            }
            for t in 0..QUAD {
                let d = scales[t];
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                for c in 0..QK {
                    let j = QUAD * g + t;
                    let q = match side {
                        // The Q8_0 quant itself.
                        Side::Shrink if j < rows => {
                            weight.data[j * row_bytes + 34 * b + 2 + c] as i8
                        }
                        Side::Shrink => 0,
                        // Rounded to the shared scale.
                        Side::Expand => {
                            (value(t, c) * id).round_ties_even().clamp(-127.0, 127.0) as i8
                        }
                    };
                    unit[offset(side, t, c)] = (q as u8) ^ 0x80;
                }
                let bits = half::f16::from_f32(d).to_le_bytes();
                unit[QUAD * QK + 2 * t..][..2].copy_from_slice(&bits);
            }
        }
    }
    WeightView::new(weight.dtype, padded, cols, bytes::Bytes::from(data))
}

/// Where row `t` (of the unit's four) and column `c` (of its 32) lie in a
/// unit of `side`.
#[inline]
pub(crate) fn offset(side: Side, t: usize, c: usize) -> usize {
    let (h, i) = (c / 16, c % 16);
    match side {
        Side::Shrink => 64 * h + 4 * (4 * t + i / 4) + i % 4,
        Side::Expand => 64 * h + 4 * i + t,
    }
}

impl QuantRow {
    /// Quantizes the whole blocks of `x` (a Q8_0 `A` is as wide).
    pub(crate) fn fill(&mut self, isa: CheckedIsa, x: &[f32]) {
        let blocks = x.len() / QK;
        self.q.resize(blocks * QK, 0);
        self.d.resize(blocks, 0.0);
        self.sums.resize(blocks, 0);
        #[cfg(target_arch = "x86_64")]
        if isa.get() == Isa::Avx512Vnni {
            // SAFETY: CheckedIsa guarantees AVX-512; the buffers were
            // sized above for `blocks` blocks.
            return unsafe { super::lora_q8_vnni::quantize(&x[..blocks * QK], self) };
        }
        self.ds.resize(2 * blocks, 0.0);
        self.halves.resize(2 * blocks, 0);
        quantize_blocks(
            isa,
            &x[..blocks * QK],
            &mut self.q,
            &mut self.ds,
            &mut self.sums,
            &mut self.halves,
        );
        for (d, pair) in self.d.iter_mut().zip(self.ds.chunks_exact(2)) {
            *d = pair[0];
        }
    }
}

/// `sums[j] = A row j · x` for the `rows` (padded) rows of a packed `a`,
/// on the quantized row `x` (as long as `a`'s rows).
pub(crate) fn shrink(isa: CheckedIsa, a: &[u8], rows: usize, x: &QuantRow, sums: &mut [f32]) {
    let fits = a.len() == x.d.len() * (rows / QUAD) * UNIT
        && rows.is_multiple_of(QUAD)
        && sums.len() >= rows
        && x.q.len() == QK * x.d.len();
    if !fits {
        return;
    }
    match isa.get() {
        // SAFETY: CheckedIsa guarantees AVX-512 VNNI; `fits` checked the
        // shapes the kernel reads and writes.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { super::lora_q8_vnni::shrink(a, rows, x, sums) },
        _ => shrink_scalar(a, rows, x, sums),
    }
}

/// `acc += Σⱼ p[j] · row j of b_t` for a packed `b_t` of `p.len()`
/// (padded) rows of `acc.len()` columns; `qp` is scratch for `p`
/// quantized.
pub(crate) fn expand(isa: CheckedIsa, p: &[f32], b_t: &[u8], qp: &mut QuantMid, acc: &mut [f32]) {
    let (rows, blocks) = (p.len(), acc.len() / QK);
    let fits = rows.is_multiple_of(QUAD)
        && acc.len().is_multiple_of(QK)
        && b_t.len() == blocks * rows / QUAD * UNIT;
    if !fits {
        return;
    }
    qp.fill(p);
    match isa.get() {
        // SAFETY: as in `shrink`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { super::lora_q8_vnni::expand(qp, b_t, acc) },
        _ => expand_scalar(qp, b_t, acc),
    }
}

/// The scale of row `t` of the unit at `unit`.
#[inline]
pub(crate) fn scale(unit: &[u8], t: usize) -> f32 {
    f16_at(unit, QUAD * QK + 2 * t)
}

/// The shrink's reference. Per unit, sixteen lanes (row `l / 4`, columns
/// `4(l % 4)..` of each half) sum their products in the integers, the
/// first lane of each row taking `-128 · Σq_x` for the stored offset; each
/// block then adds `lane · (d_A · d_x)` to its lane's f32 sum; a row is
/// its four lanes, summed `(0 + 1) + (2 + 3)`.
pub(crate) fn shrink_scalar(a: &[u8], rows: usize, x: &QuantRow, sums: &mut [f32]) {
    let (groups, blocks) = (rows / QUAD, x.d.len());
    for g in 0..groups {
        let mut lanes = [0.0f32; 16];
        for b in 0..blocks {
            let unit = &a[UNIT * (b * groups + g)..][..UNIT];
            for (l, lane) in lanes.iter_mut().enumerate() {
                let (t, quarter) = (l / 4, l % 4);
                let mut sum = if quarter == 0 { -128 * x.sums[b] } else { 0 };
                for h in 0..2 {
                    for i in 0..4 {
                        let c = 16 * h + 4 * quarter + i;
                        let w = i32::from(unit[offset(Side::Shrink, t, c)]);
                        sum += w * i32::from(x.q[QK * b + c]);
                    }
                }
                *lane = (sum as f32).mul_add(scale(unit, t) * x.d[b], *lane);
            }
        }
        for t in 0..QUAD {
            let l = &lanes[4 * t..4 * t + 4];
            sums[QUAD * g + t] = (l[0] + l[1]) + (l[2] + l[3]);
        }
    }
}

/// The expand's reference: per block of columns and group of four rows,
/// each column's four products summed in the integers (with `-128 · Σq_p`
/// for the stored offset), then one f32 multiply-add by `d_p · d_B`, the
/// groups in order.
pub(crate) fn expand_scalar(p: &QuantMid, b_t: &[u8], acc: &mut [f32]) {
    let groups = p.words.len();
    for (b, block) in acc.chunks_exact_mut(QK).enumerate() {
        for g in 0..groups {
            let unit = &b_t[UNIT * (b * groups + g)..][..UNIT];
            let s = p.d * scale(unit, 0);
            for (c, out) in block.iter_mut().enumerate() {
                let mut sum = p.offsets[g];
                for t in 0..QUAD {
                    let w = i32::from(unit[offset(Side::Expand, t, c)]);
                    sum += w * i32::from(p.q(QUAD * g + t));
                }
                *out = (sum as f32).mul_add(s, *out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use rand::{Rng, SeedableRng};

    /// `values` (`rows × cols`) as a Q8_0 view, and that view packed.
    fn packed(side: Side, rows: usize, cols: usize, values: &[f32]) -> (WeightView, WeightView) {
        let bytes = crate::formats::quantize::quantize(DType::Q8_0, values)
            .expect("Q8_0 quantizes whole blocks");
        let view = WeightView::new(DType::Q8_0, rows, cols, bytes::Bytes::from(bytes))
            .expect("bytes of the stated shape");
        let packed = pack(side, &view).expect("a Q8_0 matrix");
        (view, packed)
    }

    fn dequantized(view: &WeightView) -> Vec<f32> {
        let mut out = vec![0.0f32; view.rows * view.cols];
        let row_bytes = view.data.len() / view.rows;
        for (row, o) in view
            .data
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(view.cols))
        {
            crate::formats::dequantize_row(view.dtype, row, o).expect("a whole row");
        }
        out
    }

    /// The shrink's layout holds the Q8_0 matrix's own values (a packed
    /// unit's bytes read back through `offset` and the scales), the zero
    /// rows past the rank included; the expand's holds them within half a
    /// step of the shared scale.
    #[test]
    fn packing_keeps_the_values() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        for (rows, cols) in [(8usize, 64usize), (5, 96), (1, 32)] {
            let values: Vec<f32> = (0..rows * cols)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            for side in [Side::Shrink, Side::Expand] {
                let (view, packed) = packed(side, rows, cols, &values);
                let held = dequantized(&view);
                let padded = rows.div_ceil(QUAD) * QUAD;
                assert_eq!(packed.rows, padded);
                assert_eq!(packed.data.len(), padded * cols / QK * 34);
                let groups = padded / QUAD;
                for j in 0..padded {
                    for c in 0..cols {
                        let (b, g, t) = (c / QK, j / QUAD, j % QUAD);
                        let unit = &packed.data[UNIT * (b * groups + g)..][..UNIT];
                        let q = f32::from((unit[offset(side, t, c % QK)] ^ 0x80) as i8);
                        let got = q * scale(unit, t);
                        let want = if j < rows { held[j * cols + c] } else { 0.0 };
                        let step = scale(unit, t);
                        match side {
                            Side::Shrink => assert_eq!(got, want, "{side:?} {j} {c}"),
                            Side::Expand => assert!(
                                (got - want).abs() <= 0.5 * step + 1e-7,
                                "{side:?} {j} {c}: {got} against {want}"
                            ),
                        }
                    }
                }
            }
        }
    }

    /// Every ISA gives the scalar twins' bits, and the twins give the
    /// f32 arithmetic on the stored values within the quantization of
    /// the other operand: the shrink within `Σ |A| · (d_x / 2)` (each
    /// `x` off by at most half its block's step), the expand within
    /// `Σ |Bᵀ| · (d_p / 2)`, plus f32 rounding.
    #[test]
    fn every_isa_gives_the_twins_bits_near_the_f32_sums() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for (rank, k) in [(8usize, 576usize), (4, 32), (5, 96), (16, 64)] {
            let a_values: Vec<f32> = (0..rank * k).map(|_| rng.random_range(-0.1..0.1)).collect();
            let b_values: Vec<f32> = (0..rank * k).map(|_| rng.random_range(-0.1..0.1)).collect();
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-2.0..2.0)).collect();
            let (a_view, a) = packed(Side::Shrink, rank, k, &a_values);
            let (_, b_t) = packed(Side::Expand, rank, k, &b_values);
            let a_held = dequantized(&a_view);
            let padded = a.rows;
            let mut qx = QuantRow::default();
            qx.fill(CheckedIsa::at_most(Isa::Scalar), &x);
            let mut want = vec![0.0f32; padded];
            shrink_scalar(&a.data, padded, &qx, &mut want);
            for j in 0..rank {
                let row = &a_held[j * k..(j + 1) * k];
                let exact: f32 = row.iter().zip(&x).map(|(w, x)| w * x).sum();
                let bound: f32 = row
                    .iter()
                    .enumerate()
                    .map(|(i, w)| w.abs() * qx.d[i / QK] * 0.5)
                    .sum::<f32>()
                    + 1e-4;
                assert!((want[j] - exact).abs() <= bound, "rank {rank} row {j}");
            }
            assert!(want[rank..].iter().all(|&s| s == 0.0), "padded rows");
            // The expand of the shrink's sums into a base row.
            let base: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut qp = QuantMid::default();
            qp.fill(&want);
            let mut out = base.clone();
            expand_scalar(&qp, &b_t.data, &mut out);
            for c in 0..k {
                let groups = padded / QUAD;
                let unit = |j: usize| &b_t.data[UNIT * (c / QK * groups + j / QUAD)..][..UNIT];
                let held = |j: usize| {
                    let q = (unit(j)[offset(Side::Expand, j % QUAD, c % QK)] ^ 0x80) as i8;
                    f32::from(q) * scale(unit(j), j % QUAD)
                };
                let exact: f32 = base[c] + (0..padded).map(|j| want[j] * held(j)).sum::<f32>();
                let bound: f32 =
                    (0..padded).map(|j| held(j).abs() * qp.d * 0.5).sum::<f32>() + 1e-5;
                assert!((out[c] - exact).abs() <= bound, "rank {rank} column {c}");
            }
            for isa in Isa::supported() {
                let isa = CheckedIsa::at_most(isa);
                let mut got = vec![0.0f32; padded];
                let mut qx = QuantRow::default();
                qx.fill(isa, &x);
                shrink(isa, &a.data, padded, &qx, &mut got);
                assert_eq!(got, want, "{isa:?} shrink rank {rank} k {k}");
                let mut got_out = base.clone();
                expand(isa, &want, &b_t.data, &mut qp, &mut got_out);
                assert_eq!(got_out, out, "{isa:?} expand rank {rank} k {k}");
            }
        }
    }
}
