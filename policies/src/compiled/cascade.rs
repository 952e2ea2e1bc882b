//! `[cascade]`: under `auto`, answer with the first (cheapest) model and defer to the
//! next when the engine's confidence in the answer is too low.

use std::fmt;

use serde::Serialize;
use switchyard_seam::{TokenConfidence, CONFIDENCE_QUANTILES};

/// Which number of a [`TokenConfidence`] a cascade compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statistic {
    /// The mean token log-probability.
    Mean,
    /// The least likely token's.
    Min,
    /// The quantile `CONFIDENCE_QUANTILES[i]`.
    Quantile(usize),
}

impl Statistic {
    /// The names a policy may write: `mean`, `min`, `p05`, `p10`, `p25`, `p50`.
    pub const NAMES: [&'static str; 6] = ["mean", "min", "p05", "p10", "p25", "p50"];

    /// Parses one of [`Statistic::NAMES`].
    pub fn parse(name: &str) -> Option<Statistic> {
        match name {
            "mean" => Some(Statistic::Mean),
            "min" => Some(Statistic::Min),
            _ => {
                let i = Self::NAMES.iter().skip(2).position(|n| *n == name)?;
                (i < CONFIDENCE_QUANTILES.len()).then_some(Statistic::Quantile(i))
            }
        }
    }

    /// The statistic's value on `confidence`.
    pub fn of(self, confidence: &TokenConfidence) -> f32 {
        match self {
            Statistic::Mean => confidence.mean,
            Statistic::Min => confidence.min,
            Statistic::Quantile(i) => confidence
                .quantiles
                .get(i)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
        }
    }
}

impl fmt::Display for Statistic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Statistic::Mean => "mean",
            Statistic::Min => "min",
            Statistic::Quantile(i) => Self::NAMES.get(i + 2).copied().unwrap_or("?"),
        };
        f.write_str(name)
    }
}

impl Serialize for Statistic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The compiled `[cascade]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cascade {
    /// Model indices, tried in order.
    pub models: Vec<usize>,
    /// What is compared.
    pub statistic: Statistic,
    /// An answer whose statistic is below this (natural log) is deferred.
    pub min_confidence: f64,
}

/// What a cascade makes of one answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the answer goes to the next model.
    pub defer: bool,
    /// `p10 -2.31 < -2.00`, for headers and logs.
    pub reason: String,
}

impl Cascade {
    /// The model to defer to after `model`, if `model` is a cascade step before the last.
    pub fn next_after(&self, model: usize) -> Option<usize> {
        let at = self.models.iter().position(|&m| m == model)?;
        self.models.get(at + 1).copied()
    }

    /// Judges an answer by its confidence (the least confident choice's, for several).
    /// An answer without tokens has nothing to judge it by and is deferred.
    pub fn judge(&self, confidence: Option<&TokenConfidence>) -> Verdict {
        let Some(confidence) = confidence else {
            return Verdict {
                defer: true,
                reason: "no tokens to judge".to_string(),
            };
        };
        let value = self.statistic.of(confidence);
        let defer = f64::from(value) < self.min_confidence || value.is_nan();
        let op = if defer { "<" } else { ">=" };
        Verdict {
            defer,
            reason: format!(
                "{} {value:.2} {op} {:.2} over {} tokens",
                self.statistic, self.min_confidence, confidence.tokens
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_parse_print_and_read_their_number() {
        for name in Statistic::NAMES {
            assert_eq!(Statistic::parse(name).unwrap().to_string(), name);
        }
        assert_eq!(Statistic::parse("p99"), None);
        let c = TokenConfidence {
            tokens: 4,
            mean: -0.5,
            min: -3.0,
            quantiles: [-3.0, -2.0, -1.0, -0.1],
        };
        assert_eq!(Statistic::parse("p10").unwrap().of(&c), -2.0);
        assert_eq!(Statistic::parse("p50").unwrap().of(&c), -0.1);
        assert_eq!(Statistic::Mean.of(&c), -0.5);
        let cascade = Cascade {
            models: vec![3, 1],
            statistic: Statistic::Quantile(1),
            min_confidence: -1.5,
        };
        assert_eq!(cascade.next_after(3), Some(1));
        assert_eq!(cascade.next_after(1), None);
        assert_eq!(cascade.next_after(0), None);
        let v = cascade.judge(Some(&c));
        assert!(v.defer);
        assert_eq!(v.reason, "p10 -2.00 < -1.50 over 4 tokens");
        let sure = TokenConfidence {
            quantiles: [-1.0, -1.0, -0.5, 0.0],
            ..c
        };
        assert!(!cascade.judge(Some(&sure)).defer);
        assert!(cascade.judge(None).defer);
    }
}
