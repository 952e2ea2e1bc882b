//! How decided a model was when it picked a token: the gap between its two best
//! candidates and the entropy of its distribution, measured by the engine over the whole
//! vocabulary (a client sees at most the top 20 log-probabilities).
//!
//! Answers of one to three tokens make every quantile of their log-probabilities nearly
//! the same number; the first token's margin tells a guess between close candidates
//! from a decided answer, and is known after one token: a cascade can stop the first
//! model there ([`UnsureStop`]) and escalate at the cost of its prompt and one token.
//! For longer answers the smallest margin over the answer can stop it mid-way: once
//! one token is below the threshold the answer's minimum is too, so the rest of the
//! answer would be computed only to be dropped.

use serde::Serialize;

/// One sampled position's spread (natural log, temperature 1, after logit bias and
/// penalties, before any truncation: the distribution log-probabilities are reported on).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenMargin {
    /// Log-probability of the most likely token minus the second's (>= 0; infinite when
    /// only one token was possible).
    pub margin: f32,
    /// Entropy of the distribution, in nats (0 = certain).
    pub entropy: f32,
}

impl TokenMargin {
    /// The less decided of two, figure by figure (the smaller margin, the larger entropy).
    pub fn least(a: TokenMargin, b: TokenMargin) -> TokenMargin {
        TokenMargin {
            margin: a.margin.min(b.margin),
            entropy: a.entropy.max(b.entropy),
        }
    }
}

/// Which figure of a [`TokenMargin`] a first-token decision reads; like every cascade
/// statistic, higher means surer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarginStatistic {
    /// The top-2 margin.
    Margin,
    /// Minus the entropy.
    NegEntropy,
}

impl MarginStatistic {
    /// The figure of `margin` this statistic reads.
    pub fn of(self, margin: &TokenMargin) -> f32 {
        match self {
            MarginStatistic::Margin => margin.margin,
            MarginStatistic::NegEntropy => -margin.entropy,
        }
    }
}

/// Stop a generation at a token whose statistic is below `min` (a cascade's early
/// escalation: the answer will be deferred anyway, so the rest of it is not computed):
/// the first token only, or with `every_token` any token (the answer's smallest figure
/// is below `min` as soon as one token's is). The engine then ends it with
/// [`crate::FinishReason::Unsure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnsureStop {
    /// The figure compared.
    pub statistic: MarginStatistic,
    /// Below this the generation stops (natural log).
    pub min: f64,
    /// Whether every token is compared, not only the first.
    pub every_token: bool,
}

impl UnsureStop {
    /// Whether the generation stops at its `index`th token (0-based), of `margin`: a
    /// token this stop compares and finds too unsure.
    pub fn stops_at(&self, index: usize, margin: &TokenMargin) -> bool {
        (index == 0 || self.every_token) && self.stops(margin)
    }

    /// Whether a token of `margin` is too unsure to go on: the one comparison the
    /// engine (stopping) and the cascade (deferring) both make. NaN counts as unsure.
    pub fn stops(&self, margin: &TokenMargin) -> bool {
        let value = self.statistic.of(margin);
        value.is_nan() || f64::from(value) < self.min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_compares_the_statistic_higher_is_surer() {
        let m = TokenMargin {
            margin: 0.5,
            entropy: 1.25,
        };
        let margin = UnsureStop {
            statistic: MarginStatistic::Margin,
            min: 0.75,
            every_token: false,
        };
        assert!(margin.stops(&m));
        assert!(!UnsureStop { min: 0.5, ..margin }.stops(&m));
        let entropy = UnsureStop {
            statistic: MarginStatistic::NegEntropy,
            min: -1.0,
            every_token: false,
        };
        assert!(entropy.stops(&m), "entropy 1.25 > 1.0 is unsure");
        assert!(!entropy.stops(&TokenMargin { entropy: 0.5, ..m }));
        assert!(margin.stops(&TokenMargin {
            margin: f32::NAN,
            ..m
        }));
        let least = TokenMargin::least(
            m,
            TokenMargin {
                margin: 2.0,
                entropy: 2.0,
            },
        );
        assert_eq!((least.margin, least.entropy), (0.5, 2.0));
    }

    #[test]
    fn a_first_token_stop_ignores_later_tokens_and_an_every_token_stop_does_not() {
        let unsure = TokenMargin {
            margin: 0.5,
            entropy: 1.25,
        };
        let first = UnsureStop {
            statistic: MarginStatistic::Margin,
            min: 0.75,
            every_token: false,
        };
        assert!(first.stops_at(0, &unsure));
        assert!(!first.stops_at(3, &unsure));
        let every = UnsureStop {
            every_token: true,
            ..first
        };
        assert!(every.stops_at(0, &unsure) && every.stops_at(3, &unsure));
        let sure = TokenMargin {
            margin: 1.0,
            ..unsure
        };
        assert!(!every.stops_at(3, &sure));
    }
}
