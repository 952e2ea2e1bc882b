//! The normalizer of a row of logits and, in the same pass, how decided the row is:
//! the gap between its two best logits and its entropy ([`TokenMargin`]), for cascades
//! that judge an answer by its first token.

use switchyard_seam::TokenMargin;

/// Values per lane group: sixteen running sums and maxima the compiler keeps
/// in vector registers (four on plain x86-64, one with AVX-512).
const LANES: usize = 16;

/// `log(sum(exp(logits)))` and the row's [`TokenMargin`], over `logits` whose largest
/// value is `max` (finite; NaN already replaced by minus infinity).
///
/// One pass: the exponentials summed for the normalizer also weigh the entropy,
/// `H = ln s - t / s` with `s = sum e_i`, `t = sum e_i (l_i - max)`, `e_i = exp(l_i - max)`
/// (from `-sum p_i ln p_i` with `ln p_i = l_i - max - ln s`).
///
/// Every decoded token pays this over the whole vocabulary (49,152 entries for
/// SmolLM2), on the executor's thread between two forward passes: with a library
/// `exp` per entry and one running sum it took ~0.2 ms a token, a tenth of a decode
/// step (`docs/bench/speculation.md`). So the sums run in [`LANES`] lanes and `exp`
/// is [`exp_nonpositive`], plain arithmetic the compiler vectorizes; the sums' order
/// then differs from a running sum's, and log-probabilities move by a few units in
/// the seventh digit.
pub(super) fn normalize(logits: &[f32], max: f32) -> (f32, TokenMargin) {
    let lanes = lane_sums(logits, max);
    let sum: f32 = lanes.sum.iter().sum();
    let weighted: f32 = lanes.weighted.iter().sum();
    // The second best: the largest value once one occurrence of the best is left out
    // (a tie for the best is a margin of 0).
    let second = if lanes.at_max.iter().sum::<u32>() > 1 {
        max
    } else {
        (lanes.below.iter()).fold(f32::NEG_INFINITY, |m, &b| if b > m { b } else { m })
    };
    let ln_sum = sum.ln();
    let entropy = (ln_sum - weighted / sum).max(0.0);
    (
        max + ln_sum,
        TokenMargin {
            margin: max - second,
            entropy,
        },
    )
}

/// [`normalize`]'s sums over `logits`: 16-wide vectors where the CPU has
/// AVX-512 (Gemma 3's 262,144-entry rows took 0.6 ms a token with x86-64's
/// 4-wide ones), the same operations in the same order either way, so the
/// results agree bit for bit (tested).
fn lane_sums(logits: &[f32], max: f32) -> Lanes {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512 F, checked just above.
        return unsafe { lane_sums_avx512(logits, max) };
    }
    lane_sums_portable(logits, max)
}

/// [`lane_sums_portable`] compiled for AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lane_sums_avx512(logits: &[f32], max: f32) -> Lanes {
    lane_sums_portable(logits, max)
}

#[inline(always)]
fn lane_sums_portable(logits: &[f32], max: f32) -> Lanes {
    let mut lanes = Lanes::default();
    let (chunks, rest) = logits.as_chunks::<LANES>();
    for chunk in chunks {
        lanes.add(chunk, max);
    }
    // The remainder padded with impossible tokens, which add nothing.
    let mut last = [f32::NEG_INFINITY; LANES];
    for (slot, &l) in last.iter_mut().zip(rest) {
        *slot = l;
    }
    lanes.add(&last, max);
    lanes
}

/// [`normalize`]'s running sums, lane by lane.
struct Lanes {
    sum: [f32; LANES],
    weighted: [f32; LANES],
    /// The largest value under the maximum.
    below: [f32; LANES],
    /// How often the maximum occurs.
    at_max: [u32; LANES],
}

impl Default for Lanes {
    fn default() -> Self {
        Lanes {
            sum: [0.0; LANES],
            weighted: [0.0; LANES],
            below: [f32::NEG_INFINITY; LANES],
            at_max: [0; LANES],
        }
    }
}

impl Lanes {
    #[inline(always)]
    fn add(&mut self, chunk: &[f32; LANES], max: f32) {
        for (lane, &l) in chunk.iter().enumerate() {
            let shifted = l - max;
            let e = exp_nonpositive(shifted);
            self.sum[lane] += e;
            // `e` is 0 for impossible tokens (minus infinity), whose product is NaN.
            self.weighted[lane] += if e > 0.0 { e * shifted } else { 0.0 };
            let below = self.below[lane];
            self.below[lane] = if l < max && l > below { l } else { below };
            self.at_max[lane] += u32::from(l == max);
        }
    }
}

/// `e^x` for `x <= 0`, 0 below -87 (where `e^x` is under 2^-125, nothing next to
/// the maximum's 1). `e^x = 2^n e^r` with `n = round(x log2 e)`, `r = x - n ln 2`
/// (ln 2 split in two so that `n LN2_HI` is exact), `e^r` by its Taylor polynomial
/// of degree 7 on `|r| <= ln2/2` (truncation below 5e-9 relative): the kernels'
/// softmax `exp` (`switchyard_kernels::cpu::exp`), written with plain float and
/// bit operations, no fused multiply-add, rounding call or float-to-int
/// conversion, so that it vectorizes on any x86-64.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const MIN_X: f32 = -87.0;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and taking away 1.5 * 2^23 rounds to the nearest integer (ties to
    // even) for |v| < 2^22.
    const ROUND: f32 = 12_582_912.0;
    // 2^23 + 127: adding it to n puts the biased exponent n + 127 in the low
    // mantissa bits (exactly: the sum lies in [2^23, 2^24), whose unit is 1).
    const BIAS: f32 = 8_388_735.0;
    let clamped = if x > MIN_X { x } else { MIN_X };
    let n = (clamped * LOG2E + ROUND) - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // n is in [-126, 0]: 2^n is a normal f32 built in the exponent bits.
    let scale = f32::from_bits(((n + BIAS).to_bits() & 0x7f_ffff) << 23);
    if x < MIN_X {
        0.0
    } else {
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_and_entropy_by_hand() {
        // p = (1/4, 1/4, 1/2): the best two differ by ln 2; H = 1.5 ln 2.
        let logits = [0.0, 0.0, 2.0f32.ln()];
        let (log_norm, m) = normalize(&logits, 2.0f32.ln());
        assert!((log_norm - 4.0f32.ln()).abs() < 1e-6);
        assert!((m.margin - 2.0f32.ln()).abs() < 1e-6, "{m:?}");
        assert!((m.entropy - 1.5 * 2.0f32.ln()).abs() < 1e-6, "{m:?}");
        // A tie for the best: no margin; impossible tokens weigh nothing.
        let (_, tie) = normalize(&[1.0, f32::NEG_INFINITY, 1.0], 1.0);
        assert_eq!(tie.margin, 0.0);
        assert!((tie.entropy - 2.0f32.ln()).abs() < 1e-6);
        // One possible token: certain, an infinite margin.
        let (_, one) = normalize(&[f32::NEG_INFINITY, 3.0], 3.0);
        assert_eq!((one.margin, one.entropy), (f32::INFINITY, 0.0));
    }

    /// The lanes' `exp` against f64's, over the range a shifted logit takes:
    /// within 4e-7 relative (a few f32 units), and 0 where f32 underflows.
    #[test]
    fn exp_matches_f64_within_a_few_units() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpositive(x));
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-200.0), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    /// A vocabulary-sized row (odd length, so the lanes' remainder runs too)
    /// against the same sums in f64 by hand: the normalizer within 1e-5, the
    /// entropy within 1e-4 relative, the margin exact; the AVX-512 sums equal
    /// the portable ones bit for bit.
    #[test]
    fn a_long_row_matches_f64_sums() {
        let logits: Vec<f32> = (0..49_157u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 20_000) as f32 * 1e-3 - 12.0)
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (log_norm, m) = normalize(&logits, max);
        let s: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let t: f64 = logits
            .iter()
            .map(|&l| f64::from(l - max).exp() * f64::from(l - max))
            .sum();
        let want_norm = f64::from(max) + s.ln();
        let want_entropy = s.ln() - t / s;
        assert!(
            (f64::from(log_norm) - want_norm).abs() < 1e-5,
            "{log_norm} vs {want_norm}"
        );
        assert!(
            (f64::from(m.entropy) - want_entropy).abs() < 1e-4 * want_entropy,
            "{} vs {want_entropy}",
            m.entropy
        );
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F, checked just above.
            let wide = unsafe { lane_sums_avx512(&logits, max) };
            let narrow = lane_sums_portable(&logits, max);
            let bits = |l: &Lanes| {
                let floats = l.sum.iter().chain(&l.weighted).chain(&l.below);
                (floats.map(|f| f.to_bits()).collect::<Vec<_>>(), l.at_max)
            };
            assert_eq!(bits(&wide), bits(&narrow));
        }
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(m.margin, sorted[0] - sorted[1]);
    }
}
