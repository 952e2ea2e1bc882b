//! The normalizer of a row of logits and, in the same pass, how decided the row is:
//! the gap between its two best logits and its entropy ([`TokenMargin`]), for cascades
//! that judge an answer by its first token.

use switchyard_seam::TokenMargin;

/// `log(sum(exp(logits)))` and the row's [`TokenMargin`], over `logits` whose largest
/// value is `max` (finite; NaN already replaced by minus infinity).
///
/// One pass: the exponentials summed for the normalizer also weigh the entropy,
/// `H = ln s - t / s` with `s = sum e_i`, `t = sum e_i (l_i - max)`, `e_i = exp(l_i - max)`
/// (from `-sum p_i ln p_i` with `ln p_i = l_i - max - ln s`). The sum runs in the order
/// and precision the normalizer always had, so log-probabilities are unchanged.
pub(super) fn normalize(logits: &[f32], max: f32) -> (f32, TokenMargin) {
    let mut sum = 0.0f32;
    let mut weighted = 0.0f32;
    let mut second = f32::NEG_INFINITY;
    let mut max_seen = false;
    for &l in logits {
        let shifted = l - max;
        let e = shifted.exp();
        sum += e;
        if e > 0.0 {
            weighted += e * shifted;
        }
        // The second best: the largest value once one occurrence of the best is left out
        // (a tie for the best is a margin of 0).
        if l == max && !max_seen {
            max_seen = true;
        } else if l > second {
            second = l;
        }
    }
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
}
