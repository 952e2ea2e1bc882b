//! Choosing a cascade's `min_confidence` from measured answers (`switchyard calibrate`).
//!
//! Input: the first model's answers to a suite's items, each right or wrong, with the
//! engine's [`TokenConfidence`] in it, and optionally whether the next model answered the
//! same item right. The threshold follows [`Cascade::judge`](crate::Cascade::judge): an
//! answer whose statistic is below it (or that has no tokens) is deferred. Two goals:
//!
//! - [`Goal::Kept`]: the answers kept are right at least `accuracy` of the time, with as
//!   many kept as possible (the lowest such threshold);
//! - [`Goal::OfStrong`]: the cascade as a whole (answers kept plus the next model's
//!   answers to the deferred items) is right at least `fraction` as often as the next
//!   model alone, deferring as few as possible.
//!
//! Answers with equal statistics are kept or deferred together. The threshold sits
//! halfway between the last value kept and the next lower one, so that a rounding
//! difference between the figure measured here and the one the server computes does not
//! move an answer across it.

use serde::Serialize;
use switchyard_seam::TokenConfidence;

use crate::compiled::cascade::Statistic;

/// Where a threshold is placed below the lowest value kept when no lower value exists.
const MARGIN: f64 = 0.02;

/// One item's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Whether the first model's answer was right.
    pub correct: bool,
    /// The engine's confidence in it (`None`: no tokens).
    pub confidence: Option<TokenConfidence>,
    /// Whether the next model's answer to the same item was right, when asked.
    pub strong_correct: Option<bool>,
}

/// What the threshold must achieve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "goal", rename_all = "snake_case")]
pub enum Goal {
    /// Kept answers right at least this share of the time.
    Kept { accuracy: f64 },
    /// The cascade right at least this share as often as the next model alone.
    OfStrong { fraction: f64 },
}

/// The threshold chosen and what it does on the answers it was chosen from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    /// The statistic compared.
    pub statistic: Statistic,
    /// The threshold (natural log).
    pub min_confidence: f64,
    /// Answers measured.
    pub n: usize,
    /// Answers kept (statistic at or above the threshold), and of those right.
    pub kept: usize,
    pub kept_correct: usize,
    /// Share of answers deferred to the next model.
    pub deferred_share: f64,
    /// The first model's accuracy on all answers.
    pub first_accuracy: f64,
    /// The next model's accuracy alone, and the cascade's, when its answers are known.
    pub strong_accuracy: Option<f64>,
    pub cascade_accuracy: Option<f64>,
}

/// The statistic of every answer as the cascade compares it: no tokens or NaN count as
/// minus infinity (always deferred).
pub fn values(answers: &[Answer], statistic: Statistic) -> Vec<f64> {
    answers
        .iter()
        .map(|a| match &a.confidence {
            Some(c) => {
                let v = f64::from(statistic.of(c));
                if v.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    v
                }
            }
            None => f64::NEG_INFINITY,
        })
        .collect()
}

/// The threshold meeting `goal` (see the module documentation), or `None` when none
/// does. [`Goal::Kept`] needs at least `min_kept` answers kept; [`Goal::OfStrong`] needs
/// every answer's `strong_correct`, and may defer everything.
pub fn calibrate(
    answers: &[Answer],
    statistic: Statistic,
    goal: Goal,
    min_kept: usize,
) -> Option<Calibration> {
    let n = answers.len();
    if n == 0 {
        return None;
    }
    let values = values(answers, statistic);
    let strong: Option<Vec<bool>> = answers.iter().map(|a| a.strong_correct).collect();
    if matches!(goal, Goal::OfStrong { .. }) && strong.is_none() {
        return None;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let strong_total = strong.as_ref().map(|s| s.iter().filter(|&&c| c).count());
    let first_total = answers.iter().filter(|a| a.correct).count();

    // Candidates: keep nothing (threshold above every value), then the top `kept`
    // answers for each `kept` that ends a level of equal values.
    let mut best: Option<(usize, usize, f64)> = None; // kept, kept right, threshold
    let top = values
        .get(order.first().copied().unwrap_or(0))
        .copied()
        .unwrap_or(f64::NEG_INFINITY);
    if top.is_finite() && accepts(goal, 0, 0, 0, strong_total, min_kept) {
        best = Some((0, 0, top + MARGIN));
    }
    let (mut kept_correct, mut strong_kept) = (0usize, 0usize);
    for (i, &item) in order.iter().enumerate() {
        let kept = i + 1;
        kept_correct += usize::from(answers[item].correct);
        strong_kept += usize::from(strong.as_ref().is_some_and(|s| s[item]));
        let value = values[item];
        let next = order.get(kept).map(|&j| values[j]);
        if next == Some(value) || !value.is_finite() {
            continue;
        }
        if accepts(
            goal,
            kept,
            kept_correct,
            strong_kept,
            strong_total,
            min_kept,
        ) {
            let threshold = match next {
                Some(lower) if lower.is_finite() => (value + lower) / 2.0,
                _ => value - MARGIN,
            };
            best = Some((kept, kept_correct, threshold));
        }
    }
    let (kept, kept_correct, threshold) = best?;
    let deferred: Vec<usize> = order.iter().skip(kept).copied().collect();
    let cascade_correct = strong
        .as_ref()
        .map(|s| kept_correct + deferred.iter().filter(|&&i| s[i]).count());
    Some(Calibration {
        statistic,
        // Four decimals: what a policy file shows, and still between the two values.
        min_confidence: (threshold * 1e4).round() / 1e4,
        n,
        kept,
        kept_correct,
        deferred_share: (n - kept) as f64 / n as f64,
        first_accuracy: first_total as f64 / n as f64,
        strong_accuracy: strong_total.map(|c| c as f64 / n as f64),
        cascade_accuracy: cascade_correct.map(|c| c as f64 / n as f64),
    })
}

/// Whether keeping the top `kept` answers meets `goal`.
fn accepts(
    goal: Goal,
    kept: usize,
    kept_correct: usize,
    strong_kept: usize,
    strong_total: Option<usize>,
    min_kept: usize,
) -> bool {
    match goal {
        Goal::Kept { accuracy } => {
            kept >= min_kept.max(1) && kept_correct as f64 >= accuracy * kept as f64
        }
        Goal::OfStrong { fraction } => strong_total.is_some_and(|total| {
            // Kept answers as the first model gave them, the rest as the next model did.
            let cascade = kept_correct + (total - strong_kept);
            cascade as f64 >= fraction * total as f64
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(correct: bool, p10: Option<f32>, strong: Option<bool>) -> Answer {
        Answer {
            correct,
            confidence: p10.map(|v| TokenConfidence {
                tokens: 3,
                mean: v,
                min: v,
                quantiles: [v; 4],
                first: None,
                min_margin: None,
            }),
            strong_correct: strong,
        }
    }

    fn p10() -> Statistic {
        Statistic::parse("p10").unwrap()
    }

    #[test]
    fn keeps_the_most_answers_that_reach_the_accuracy_asked() {
        // Sure answers are right, unsure ones mostly wrong.
        let answers = [
            answer(true, Some(-0.1), None),
            answer(true, Some(-0.2), None),
            answer(true, Some(-0.3), None),
            answer(false, Some(-0.4), None),
            answer(true, Some(-1.0), None),
            answer(false, Some(-2.0), None),
            answer(false, None, None),
        ];
        let c = calibrate(&answers, p10(), Goal::Kept { accuracy: 0.8 }, 2).unwrap();
        // Keeping 5 gives 4/5 = 0.8; keeping 6 gives 4/6.
        assert_eq!((c.kept, c.kept_correct), (5, 4));
        assert_eq!(c.min_confidence, -1.5);
        assert!((c.deferred_share - 2.0 / 7.0).abs() < 1e-12);
        assert_eq!(c.cascade_accuracy, None);
        // Nothing reaches 1.0 with 4 kept at least.
        assert!(calibrate(&answers, p10(), Goal::Kept { accuracy: 1.0 }, 4).is_none());
        // With 3: the top three, placed halfway to the fourth.
        let c = calibrate(&answers, p10(), Goal::Kept { accuracy: 1.0 }, 3).unwrap();
        assert_eq!((c.kept, c.min_confidence), (3, -0.35));
        // The lowest finite value kept: the threshold sits just below it.
        let all_right = [answer(true, Some(-0.5), None), answer(true, None, None)];
        let c = calibrate(&all_right, p10(), Goal::Kept { accuracy: 1.0 }, 1).unwrap();
        assert_eq!((c.kept, c.min_confidence), (1, -0.52));
    }

    #[test]
    fn ties_are_kept_or_deferred_together() {
        let answers = [
            answer(true, Some(-0.5), None),
            answer(false, Some(-0.5), None),
            answer(true, Some(-0.1), None),
        ];
        let c = calibrate(&answers, p10(), Goal::Kept { accuracy: 0.9 }, 1).unwrap();
        assert_eq!((c.kept, c.min_confidence), (1, -0.3));
    }

    #[test]
    fn of_strong_defers_as_little_as_reaches_the_share_of_the_next_models_accuracy() {
        // The first model is right on its sure answers; the next model is right on most.
        let answers = [
            answer(true, Some(-0.1), Some(true)),
            answer(true, Some(-0.2), Some(false)),
            answer(false, Some(-0.9), Some(true)),
            answer(false, Some(-1.5), Some(true)),
            answer(true, Some(-2.5), Some(true)),
        ];
        // The next model alone: 4/5. Keeping two and deferring three: 2 + 3 = 5/5.
        // Keeping four: 2 + 1 = 3/5 < 0.95 * 0.8; keeping three: 2 + 2 = 4/5.
        let c = calibrate(&answers, p10(), Goal::OfStrong { fraction: 0.95 }, 5).unwrap();
        assert_eq!(c.kept, 3);
        assert_eq!(c.min_confidence, -1.2);
        assert_eq!(c.strong_accuracy, Some(0.8));
        assert_eq!(c.cascade_accuracy, Some(0.8));
        // Without the next model's answers the goal cannot be judged.
        let first_only: Vec<_> = answers
            .iter()
            .map(|a| Answer {
                strong_correct: None,
                ..a.clone()
            })
            .collect();
        assert!(calibrate(&first_only, p10(), Goal::OfStrong { fraction: 0.9 }, 1).is_none());
        // When only the next model will do, everything is deferred.
        let hopeless = [
            answer(false, Some(-0.1), Some(true)),
            answer(false, Some(-0.2), Some(true)),
        ];
        let c = calibrate(&hopeless, p10(), Goal::OfStrong { fraction: 1.0 }, 1).unwrap();
        assert_eq!((c.kept, c.min_confidence), (0, -0.08));
    }

    #[test]
    fn a_margin_threshold_is_placed_on_the_margins_scale() {
        let with_margin = |correct, margin: f32, strong| Answer {
            correct,
            confidence: TokenConfidence::of(
                &mut [-0.01],
                &[switchyard_seam::TokenMargin {
                    margin,
                    entropy: 0.5,
                }],
            ),
            strong_correct: Some(strong),
        };
        // The quantiles are all the same; only the margins tell right from wrong.
        let answers = [
            with_margin(true, 4.0, true),
            with_margin(true, 2.5, true),
            with_margin(false, 0.5, true),
            with_margin(false, 0.25, true),
        ];
        let margin = Statistic::parse("margin").unwrap();
        let c = calibrate(&answers, margin, Goal::OfStrong { fraction: 1.0 }, 1).unwrap();
        assert_eq!((c.kept, c.min_confidence), (2, 1.5));
        assert!(
            calibrate(&answers, p10(), Goal::OfStrong { fraction: 1.0 }, 1)
                .is_some_and(|c| c.kept == 0)
        );
    }
}
