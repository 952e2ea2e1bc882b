//! How sure a generation was of its own answer: a summary of the log-probabilities of
//! the tokens it produced, computed by the engine, which sees every token's probability.
//!
//! Cascades defer to a stronger model when a low quantile of these falls below a
//! threshold (Gupta et al., "Language Model Cascades: Token-level uncertainty and
//! beyond", ICLR 2024: quantiles of the per-token log-probabilities separate easy
//! answers from hard ones better than their sum or mean).

use serde::Serialize;

/// The quantiles a [`TokenConfidence`] carries, in order.
pub const CONFIDENCE_QUANTILES: [f32; 4] = [0.05, 0.1, 0.25, 0.5];

/// A summary of an answer's token log-probabilities (natural log, 0 = certain).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenConfidence {
    /// Tokens summarized.
    pub tokens: u32,
    /// Mean log-probability.
    pub mean: f32,
    /// The least likely token's.
    pub min: f32,
    /// The [`CONFIDENCE_QUANTILES`] of the log-probabilities (nearest rank).
    pub quantiles: [f32; 4],
}

impl TokenConfidence {
    /// The summary of `logprobs` (reordered in place); `None` when empty.
    pub fn of(logprobs: &mut [f32]) -> Option<TokenConfidence> {
        if logprobs.is_empty() {
            return None;
        }
        logprobs.sort_by(f32::total_cmp);
        let n = logprobs.len();
        let mean = logprobs.iter().map(|&l| f64::from(l)).sum::<f64>() / n as f64;
        let quantile = |q: f32| {
            // Nearest rank: the smallest value with at least q of the tokens at or below it.
            let rank = ((q * n as f32).ceil() as usize).clamp(1, n);
            logprobs.get(rank - 1).copied().unwrap_or(f32::NEG_INFINITY)
        };
        Some(TokenConfidence {
            tokens: u32::try_from(n).unwrap_or(u32::MAX),
            mean: mean as f32,
            min: logprobs.first().copied().unwrap_or(f32::NEG_INFINITY),
            quantiles: CONFIDENCE_QUANTILES.map(quantile),
        })
    }

    /// The least confident of several answers (a request's choices), statistic by
    /// statistic.
    pub fn least(a: TokenConfidence, b: TokenConfidence) -> TokenConfidence {
        let mut quantiles = a.quantiles;
        for (q, other) in quantiles.iter_mut().zip(b.quantiles) {
            *q = q.min(other);
        }
        TokenConfidence {
            tokens: a.tokens.min(b.tokens),
            mean: a.mean.min(b.mean),
            min: a.min.min(b.min),
            quantiles,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks_of_the_sorted_logprobs() {
        let mut logprobs: Vec<f32> = (1..=20).map(|i| -(i as f32) / 10.0).collect();
        let c = TokenConfidence::of(&mut logprobs).unwrap();
        assert_eq!(c.tokens, 20);
        assert_eq!(c.min, -2.0);
        // 5% of 20 is the 1st smallest, 10% the 2nd, 25% the 5th, 50% the 10th.
        assert_eq!(c.quantiles, [-2.0, -1.9, -1.6, -1.1]);
        assert!((c.mean + 1.05).abs() < 1e-6);
        assert_eq!(TokenConfidence::of(&mut []), None);
        let one = TokenConfidence::of(&mut [-0.5]).unwrap();
        assert_eq!(one.quantiles, [-0.5; 4]);
        let least = TokenConfidence::least(c, one);
        assert_eq!(
            (least.min, least.quantiles[3], least.tokens),
            (-2.0, -1.1, 1)
        );
    }
}
