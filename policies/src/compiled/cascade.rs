//! `[cascade]`: under `auto`, answer with the first (cheapest) model and defer to the
//! next when the engine's confidence in the answer is too low.

use std::fmt;

use serde::Serialize;
use switchyard_seam::{
    MarginStatistic, TokenConfidence, TokenMargin, UnsureStop, CONFIDENCE_QUANTILES,
};

/// Which number of a [`TokenConfidence`] a cascade compares; for every one, higher is
/// surer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statistic {
    /// The mean token log-probability.
    Mean,
    /// The least likely token's.
    Min,
    /// The quantile `CONFIDENCE_QUANTILES[i]`.
    Quantile(usize),
    /// The first token's top-2 margin, or minus its entropy: known after one token, so
    /// the first model stops there when it will be deferred ([`Cascade::unsure_stop`]).
    First(MarginStatistic),
    /// The smallest top-2 margin over the answer's tokens.
    MinMargin,
}

impl Statistic {
    /// The names a policy may write.
    pub const NAMES: [&'static str; 9] = [
        "mean",
        "min",
        "p05",
        "p10",
        "p25",
        "p50",
        "margin",
        "neg_entropy",
        "min_margin",
    ];

    /// Parses one of [`Statistic::NAMES`].
    pub fn parse(name: &str) -> Option<Statistic> {
        match name {
            "mean" => Some(Statistic::Mean),
            "min" => Some(Statistic::Min),
            "margin" => Some(Statistic::First(MarginStatistic::Margin)),
            "neg_entropy" => Some(Statistic::First(MarginStatistic::NegEntropy)),
            "min_margin" => Some(Statistic::MinMargin),
            _ => {
                let i = ["p05", "p10", "p25", "p50"]
                    .iter()
                    .position(|n| *n == name)?;
                (i < CONFIDENCE_QUANTILES.len()).then_some(Statistic::Quantile(i))
            }
        }
    }

    /// The statistic's value on `confidence` (minus infinity when it was not measured:
    /// such an answer is deferred).
    pub fn of(self, confidence: &TokenConfidence) -> f32 {
        match self {
            Statistic::Mean => confidence.mean,
            Statistic::Min => confidence.min,
            Statistic::Quantile(i) => confidence
                .quantiles
                .get(i)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
            Statistic::First(first) => confidence.first.map_or(f32::NEG_INFINITY, |m| first.of(&m)),
            Statistic::MinMargin => confidence.min_margin.unwrap_or(f32::NEG_INFINITY),
        }
    }

    /// Why `min` cannot be a threshold of this statistic, if it cannot: log-probabilities
    /// and minus entropies are 0 or below, margins 0 or above.
    pub fn threshold_error(self, min: f64) -> Option<String> {
        let (fits, what) = match self {
            Statistic::First(MarginStatistic::Margin) | Statistic::MinMargin => (
                min >= 0.0,
                "a log-probability margin (0 or above, e.g. 0.5)",
            ),
            Statistic::First(MarginStatistic::NegEntropy) => {
                (min <= 0.0, "minus an entropy (0 or below, e.g. -1.0)")
            }
            _ => (min <= 0.0, "a log-probability (0 or below, e.g. -1.5)"),
        };
        (!(fits && min.is_finite()))
            .then(|| format!("min_confidence of `{self}` is {what}, got {min}"))
    }
}

impl fmt::Display for Statistic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Statistic::Mean => "mean",
            Statistic::Min => "min",
            Statistic::Quantile(i) => Self::NAMES.get(i + 2).copied().unwrap_or("?"),
            Statistic::First(MarginStatistic::Margin) => "margin",
            Statistic::First(MarginStatistic::NegEntropy) => "neg_entropy",
            Statistic::MinMargin => "min_margin",
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
    /// A deferred answer is handed off: the next model is given the answer up to its
    /// first unsure token and continues it (only under `min_margin`, whose stop ends the
    /// answer at that token).
    pub handoff: bool,
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

    /// The stop that ends a step's generation at a token that settles its deferral
    /// (early escalation): with a first-token statistic, an unsure first token; with
    /// `min_margin`, any token whose margin is below the threshold (the answer's smallest
    /// margin then is). `None` for the other whole-answer statistics.
    pub fn unsure_stop(&self) -> Option<UnsureStop> {
        let (statistic, every_token) = match self.statistic {
            Statistic::First(statistic) => (statistic, false),
            Statistic::MinMargin => (MarginStatistic::Margin, true),
            _ => return None,
        };
        Some(UnsureStop {
            statistic,
            min: self.min_confidence,
            every_token,
        })
    }

    /// Whether a deferred answer the engine stopped at its first unsure token is handed
    /// off (the next model continues its sure part) rather than answered again.
    pub fn hands_off(&self) -> bool {
        self.handoff && self.statistic == Statistic::MinMargin
    }

    /// Whether the verdict is known after the first token (a first-token statistic): a
    /// stream then waits for one token, not the whole answer.
    pub fn judged_on_first_token(&self) -> bool {
        matches!(self.statistic, Statistic::First(_))
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
        if self.judged_on_first_token() {
            return self.judge_first(confidence.first.as_ref());
        }
        let value = self.statistic.of(confidence);
        let defer = f64::from(value) < self.min_confidence || value.is_nan();
        self.verdict(defer, value, &format!("over {} tokens", confidence.tokens))
    }

    /// Judges an answer by its first token's margin (the least decided choice's, for
    /// several), with a first-token statistic: what [`UnsureStop::stops`] says, so an
    /// answer the engine stopped is always deferred. Without a first-token statistic, or
    /// without a measured first token, the answer is deferred.
    pub fn judge_first(&self, first: Option<&TokenMargin>) -> Verdict {
        let stop = self.unsure_stop().filter(|_| self.judged_on_first_token());
        let (Some(stop), Some(first)) = (stop, first) else {
            return Verdict {
                defer: true,
                reason: "no first token to judge".to_string(),
            };
        };
        let value = stop.statistic.of(first);
        self.verdict(stop.stops(first), value, "on the first token")
    }

    fn verdict(&self, defer: bool, value: f32, over: &str) -> Verdict {
        let op = if defer { "<" } else { ">=" };
        Verdict {
            defer,
            reason: format!(
                "{} {value:.2} {op} {:.2} {over}",
                self.statistic, self.min_confidence
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
            assert_eq!(
                Statistic::parse(name)
                    .expect("a known statistic")
                    .to_string(),
                name
            );
        }
        assert_eq!(Statistic::parse("p99"), None);
        let c = TokenConfidence {
            tokens: 4,
            mean: -0.5,
            min: -3.0,
            quantiles: [-3.0, -2.0, -1.0, -0.1],
            first: None,
            min_margin: None,
        };
        assert_eq!(
            Statistic::parse("p10").expect("a known statistic").of(&c),
            -2.0
        );
        assert_eq!(
            Statistic::parse("p50").expect("a known statistic").of(&c),
            -0.1
        );
        assert_eq!(Statistic::Mean.of(&c), -0.5);
        let cascade = Cascade {
            models: vec![3, 1],
            statistic: Statistic::Quantile(1),
            min_confidence: -1.5,
            handoff: false,
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

    #[test]
    fn a_first_token_statistic_stops_early_and_judges_as_the_stop_does() {
        let cascade = Cascade {
            models: vec![0, 1],
            statistic: Statistic::parse("margin").expect("a known statistic"),
            min_confidence: 0.5,
            handoff: false,
        };
        let stop = cascade
            .unsure_stop()
            .expect("a margin statistic stops early");
        assert_eq!(stop.statistic, MarginStatistic::Margin);
        assert!(!stop.every_token && cascade.judged_on_first_token());
        let unsure = TokenMargin {
            margin: 0.25,
            entropy: 1.5,
        };
        let sure = TokenMargin {
            margin: 2.0,
            entropy: 0.1,
        };
        // What the engine stops is what the cascade defers, from the first token alone
        // or from the whole answer's summary.
        assert!(stop.stops(&unsure) && !stop.stops(&sure));
        let v = cascade.judge_first(Some(&unsure));
        assert!(v.defer);
        assert_eq!(v.reason, "margin 0.25 < 0.50 on the first token");
        let answer = TokenConfidence::of(&mut [-0.01, -3.0], &[sure, unsure])
            .expect("one confidence per token");
        let v = cascade.judge(Some(&answer));
        assert!(!v.defer, "the later unsure token does not count: {v:?}");
        assert_eq!(v.reason, "margin 2.00 >= 0.50 on the first token");
        assert!(cascade.judge_first(None).defer);
        let unmeasured = TokenConfidence::of(&mut [-0.01], &[]).expect("one confidence per token");
        assert!(cascade.judge(Some(&unmeasured)).defer);
        // Whole-answer statistics stop nothing early, but the smallest margin.
        let p10 = Cascade {
            statistic: Statistic::Quantile(1),
            min_confidence: -1.0,
            ..cascade.clone()
        };
        assert_eq!(p10.unsure_stop(), None);
        let entropy = Cascade {
            statistic: Statistic::parse("neg_entropy").expect("a known statistic"),
            min_confidence: -1.0,
            ..cascade
        };
        assert!(entropy.judge_first(Some(&unsure)).defer);
        assert!(!entropy.judge_first(Some(&sure)).defer);
        assert_eq!(Statistic::MinMargin.of(&answer), 0.25);
        // Thresholds on the statistic's own scale.
        assert_eq!(Statistic::MinMargin.threshold_error(0.5), None);
        assert!(Statistic::MinMargin
            .threshold_error(-0.5)
            .expect("a negative margin is refused")
            .contains("margin (0 or above"));
        assert!(Statistic::Mean.threshold_error(0.5).is_some());
        assert_eq!(
            Statistic::parse("neg_entropy")
                .expect("a known statistic")
                .threshold_error(-2.0),
            None
        );
    }

    #[test]
    fn min_margin_stops_at_any_unsure_token_and_judges_the_whole_answer() {
        let cascade = Cascade {
            models: vec![0, 1],
            statistic: Statistic::MinMargin,
            min_confidence: 0.5,
            handoff: false,
        };
        let stop = cascade
            .unsure_stop()
            .expect("a margin statistic stops early");
        assert_eq!(
            stop,
            UnsureStop {
                statistic: MarginStatistic::Margin,
                min: 0.5,
                every_token: true,
            }
        );
        assert!(!cascade.judged_on_first_token());
        let sure = TokenMargin {
            margin: 2.0,
            entropy: 0.1,
        };
        let unsure = TokenMargin {
            margin: 0.25,
            entropy: 1.5,
        };
        // The engine stops at the third token; the answer it leaves (three tokens, the
        // last unsure) is deferred by the same comparison, whatever its first token.
        assert!(!stop.stops_at(1, &sure) && stop.stops_at(2, &unsure));
        let stopped = TokenConfidence::of(&mut [-0.01, -0.02, -2.0], &[sure, sure, unsure])
            .expect("one confidence per token");
        let v = cascade.judge(Some(&stopped));
        assert!(v.defer);
        assert_eq!(v.reason, "min_margin 0.25 < 0.50 over 3 tokens");
        let whole = TokenConfidence::of(&mut [-0.01, -0.02], &[sure, sure])
            .expect("one confidence per token");
        assert!(!cascade.judge(Some(&whole)).defer);
        // Not a first-token verdict (a stream waits for the whole answer): a first-token
        // judgement has nothing to go by and defers, as documented.
        assert!(cascade.judge_first(Some(&sure)).defer);
    }
}
