//! Accuracy with its 95% Wilson score interval.

use serde::Serialize;

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// Wilson score interval at 95% for `correct` successes out of `n`.
/// Unlike the normal approximation it stays inside [0, 1] and is not
/// degenerate at 0 or n successes, which small suites hit often.
pub fn wilson95(correct: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = correct as f64 / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// What a suite run measured.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Items scored.
    pub n: usize,
    /// Fraction right: the likeliest choice, or an exact generated match.
    pub acc: f64,
    /// As `acc`, choices ranked by log-likelihood per byte (generation
    /// items count as for `acc`).
    pub acc_norm: f64,
    /// 95% Wilson interval of `acc`.
    pub ci95: [f64; 2],
}

impl Summary {
    pub fn new(n: usize, correct: usize, correct_norm: usize) -> Summary {
        let (lo, hi) = wilson95(correct, n);
        let frac = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
        Summary {
            n,
            acc: frac(correct),
            acc_norm: frac(correct_norm),
            ci95: [lo, hi],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_published_values() {
        // 81 of 263 (Wilson 1927 as tabulated by Newcombe 1998, method 3): 0.2553-0.3662.
        let (lo, hi) = wilson95(81, 263);
        assert!(
            (lo - 0.2553).abs() < 5e-4 && (hi - 0.3662).abs() < 5e-4,
            "{lo} {hi}"
        );
        // 0 of 10: 0-0.2775.
        let (lo, hi) = wilson95(0, 10);
        assert!(lo == 0.0 && (hi - 0.2775).abs() < 5e-4, "{hi}");
        assert_eq!(wilson95(0, 0), (0.0, 1.0));
    }

    #[test]
    fn summary_fractions() {
        let s = Summary::new(4, 3, 2);
        assert_eq!((s.acc, s.acc_norm), (0.75, 0.5));
        assert!(s.ci95[0] < 0.75 && s.ci95[1] > 0.75);
    }
}
