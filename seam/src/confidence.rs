//! How sure a generation was of its own answer: a summary of the log-probabilities of
//! the tokens it produced, and of how decided it was at each pick, computed by the
//! engine, which sees every token's probability.
//!
//! Cascades defer to a stronger model when a low quantile of these falls below a
//! threshold (Gupta et al., "Language Model Cascades: Token-level uncertainty and
//! beyond", ICLR 2024: quantiles of the per-token log-probabilities separate easy
//! answers from hard ones better than their sum or mean), or when the first token's
//! top-2 margin or entropy ([`TokenMargin`]) does: for answers of a few tokens the
//! quantiles are all close to the one least likely token.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::TokenMargin;

/// The quantiles a [`TokenConfidence`] carries, in order.
pub const CONFIDENCE_QUANTILES: [f32; 4] = [0.05, 0.1, 0.25, 0.5];

/// Names of [`CONFIDENCE_QUANTILES`] in the text form.
const QUANTILE_NAMES: [&str; 4] = ["p05", "p10", "p25", "p50"];

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
    /// The first token's margin and entropy, when measured.
    pub first: Option<TokenMargin>,
    /// The smallest top-2 margin over the answer's tokens, when measured.
    pub min_margin: Option<f32>,
}

impl TokenConfidence {
    /// The summary of `logprobs` (reordered in place) and, when measured, every token's
    /// `margins` in order; `None` when there are no log-probabilities.
    pub fn of(logprobs: &mut [f32], margins: &[TokenMargin]) -> Option<TokenConfidence> {
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
            first: margins.first().copied(),
            min_margin: margins.iter().map(|m| m.margin).reduce(f32::min),
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
            first: a.first.zip(b.first).map(|(a, b)| TokenMargin::least(a, b)),
            min_margin: a.min_margin.zip(b.min_margin).map(|(a, b)| a.min(b)),
        }
    }
}

/// `tokens=3 mean=-0.21 min=-0.5 p05=-0.5 p10=-0.5 p25=-0.3 p50=-0.1 margin=2.5
/// min_margin=0.8 entropy=0.9` (the last three when measured): the
/// `x-switchyard-confidence` header. Numbers print exactly (the shortest text that
/// reads back as the same `f32`), so a client calibrating on them sees what the
/// server compares.
impl fmt::Display for TokenConfidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tokens={} mean={} min={}",
            self.tokens, self.mean, self.min
        )?;
        for (name, q) in QUANTILE_NAMES.iter().zip(self.quantiles) {
            write!(f, " {name}={q}")?;
        }
        if let Some(first) = self.first {
            write!(f, " margin={}", first.margin)?;
        }
        if let Some(min_margin) = self.min_margin {
            write!(f, " min_margin={min_margin}")?;
        }
        if let Some(first) = self.first {
            write!(f, " entropy={}", first.entropy)?;
        }
        Ok(())
    }
}

/// A [`TokenConfidence`] text that does not read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("confidence summary `{text}`: {reason}")]
pub struct ConfidenceParseError {
    text: String,
    reason: String,
}

impl FromStr for TokenConfidence {
    type Err = ConfidenceParseError;

    /// Reads the [`fmt::Display`] form back.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason: String| ConfidenceParseError {
            text: text.to_owned(),
            reason,
        };
        let mut fields = std::collections::HashMap::new();
        for pair in text.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| error(format!("`{pair}` is not key=value")))?;
            let value: f32 = value
                .parse()
                .map_err(|_| error(format!("`{key}` = `{value}` is not a number")))?;
            fields.insert(key, value);
        }
        let get = |key: &str| {
            fields
                .get(key)
                .copied()
                .ok_or_else(|| error(format!("`{key}` is missing")))
        };
        let mut quantiles = [0.0; 4];
        for (q, name) in quantiles.iter_mut().zip(QUANTILE_NAMES) {
            *q = get(name)?;
        }
        let first = match (fields.get("margin"), fields.get("entropy")) {
            (Some(&margin), Some(&entropy)) => Some(TokenMargin { margin, entropy }),
            (None, None) => None,
            _ => return Err(error("`margin` and `entropy` go together".to_owned())),
        };
        Ok(TokenConfidence {
            tokens: get("tokens")? as u32,
            mean: get("mean")?,
            min: get("min")?,
            quantiles,
            first,
            min_margin: fields.get("min_margin").copied(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks_of_the_sorted_logprobs() {
        let mut logprobs: Vec<f32> = (1..=20).map(|i| -(i as f32) / 10.0).collect();
        let c = TokenConfidence::of(&mut logprobs, &[]).unwrap();
        assert_eq!(c.tokens, 20);
        assert_eq!(c.min, -2.0);
        // 5% of 20 is the 1st smallest, 10% the 2nd, 25% the 5th, 50% the 10th.
        assert_eq!(c.quantiles, [-2.0, -1.9, -1.6, -1.1]);
        assert!((c.mean + 1.05).abs() < 1e-6);
        assert_eq!(TokenConfidence::of(&mut [], &[]), None);
        let one = TokenConfidence::of(&mut [-0.5], &[]).unwrap();
        assert_eq!(one.quantiles, [-0.5; 4]);
        let least = TokenConfidence::least(c, one);
        assert_eq!(
            (least.min, least.quantiles[3], least.tokens),
            (-2.0, -1.1, 1)
        );
        assert_eq!(least.first, None);
    }

    #[test]
    fn margins_give_the_first_tokens_and_the_smallest() {
        let margins = [
            TokenMargin {
                margin: 1.5,
                entropy: 0.25,
            },
            TokenMargin {
                margin: 0.125,
                entropy: 2.0,
            },
        ];
        let c = TokenConfidence::of(&mut [-0.1, -0.2], &margins).unwrap();
        assert_eq!(c.first, Some(margins[0]));
        assert_eq!(c.min_margin, Some(0.125));
        let other = TokenConfidence::of(&mut [-0.3], &margins[1..]).unwrap();
        let least = TokenConfidence::least(c, other);
        assert_eq!(
            least.first,
            Some(TokenMargin::least(margins[0], margins[1]))
        );
    }

    #[test]
    fn the_text_form_reads_back_exactly() {
        let margins = [TokenMargin {
            margin: 0.1 + 0.2,
            entropy: 1.0 / 3.0,
        }];
        let c = TokenConfidence::of(&mut [-0.123_456_79, -2.5, -1e-7], &margins).unwrap();
        let text = c.to_string();
        assert!(text.starts_with("tokens=3 mean="), "{text}");
        assert_eq!(text.parse::<TokenConfidence>().unwrap(), c);
        let bare = TokenConfidence::of(&mut [-0.5], &[]).unwrap();
        assert_eq!(bare.to_string().parse::<TokenConfidence>().unwrap(), bare);
        let infinite = TokenConfidence {
            first: Some(TokenMargin {
                margin: f32::INFINITY,
                entropy: 0.0,
            }),
            ..bare
        };
        assert_eq!(
            infinite.to_string().parse::<TokenConfidence>().unwrap(),
            infinite
        );
        let err = "tokens=1 mean=x".parse::<TokenConfidence>().unwrap_err();
        assert!(
            err.to_string().contains("`mean` = `x` is not a number"),
            "{err}"
        );
        assert!("tokens=1 margin=1"
            .parse::<TokenConfidence>()
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }
}
