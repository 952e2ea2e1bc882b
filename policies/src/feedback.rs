//! Quality signals of served answers, per checkpoint and split arm: the scores clients
//! send back for an answer (`POST /v1/feedback`) and an automatic one, the engine's
//! confidence in each answer (its mean token log-probability).
//!
//! The book remembers the most recent answers (who asked, which checkpoint and arm
//! answered) so that a score can be checked and attributed; the oldest are forgotten
//! past [`ANSWERS_KEPT`], and a score for a forgotten answer is refused like an unknown
//! one. It lives in the [`crate::PolicyStore`], so a policy reload keeps it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;
use thiserror::Error;

/// Answers remembered for scoring (about 100 bytes each).
pub const ANSWERS_KEPT: usize = 100_000;

/// Who got an answer and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `model@version` that answered.
    pub checkpoint: String,
    /// The split and arm that chose it, if a split did.
    pub split_arm: Option<(String, String)>,
    /// The tenant that asked (`None`: anonymous); only it may score the answer.
    pub tenant: Option<String>,
}

impl Answer {
    /// `split/arm`, when a split chose the checkpoint.
    pub fn arm_label(&self) -> Option<String> {
        self.split_arm
            .as_ref()
            .map(|(split, arm)| format!("{split}/{arm}"))
    }
}

/// Why a score was refused.
#[derive(Debug, Error, PartialEq)]
pub enum FeedbackError {
    /// No remembered answer has this id for this caller.
    #[error("no answer `{0}` to score: the id is unknown, was answered for another caller, or is older than the last {ANSWERS_KEPT} answers")]
    UnknownAnswer(String),
    /// The answer was scored already.
    #[error("answer `{0}` was scored already; an answer takes one score")]
    AlreadyScored(String),
    /// A score outside 0..=1.
    #[error("score must be a number from 0 to 1, got {0}")]
    ScoreOutOfRange(f64),
}

/// A mean with its 95% interval (normal approximation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mean {
    /// Samples.
    pub n: u64,
    /// Their mean.
    pub mean: f64,
    /// 95% interval of the mean.
    pub ci95: [f64; 2],
}

impl Mean {
    /// Standard error of the mean (the interval's half-width over 1.96).
    pub fn std_error(&self) -> f64 {
        (self.ci95[1] - self.ci95[0]) / 2.0 / 1.96
    }
}

/// The quality signals of one checkpoint (through one arm, or directly).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualitySignals {
    /// `model@version`.
    pub checkpoint: String,
    /// `split/arm`, when a split chose it.
    pub arm: Option<String>,
    /// Client scores (0..=1).
    pub feedback: Option<Mean>,
    /// Mean token log-probability of the answers (closer to 0: surer).
    pub confidence: Option<Mean>,
}

/// Count, sum and sum of squares of a signal, for its mean and interval.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Running {
    n: u64,
    sum: f64,
    sum_sq: f64,
}

impl Running {
    pub(crate) fn add(&mut self, x: f64) {
        self.n += 1;
        self.sum += x;
        self.sum_sq += x * x;
    }

    /// Both samples together (the buckets of a sliding window).
    pub(crate) fn merge(&mut self, other: &Running) {
        self.n += other.n;
        self.sum += other.sum;
        self.sum_sq += other.sum_sq;
    }

    pub(crate) fn mean(&self) -> Option<Mean> {
        if self.n == 0 {
            return None;
        }
        let n = self.n as f64;
        let mean = self.sum / n;
        let variance = if self.n > 1 {
            ((self.sum_sq - n * mean * mean) / (n - 1.0)).max(0.0)
        } else {
            0.0
        };
        let half = 1.96 * (variance / n).sqrt();
        Some(Mean {
            n: self.n,
            mean,
            ci95: [mean - half, mean + half],
        })
    }
}

#[derive(Debug, Default)]
struct Signals {
    feedback: Running,
    confidence: Running,
}

type Key = (String, Option<String>);

#[derive(Debug, Default)]
struct Book {
    /// By answer id; `bool`: scored already.
    answers: HashMap<String, (Answer, bool)>,
    /// Answer ids, oldest first, for forgetting.
    order: VecDeque<String>,
    signals: BTreeMap<Key, Signals>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct FeedbackBook {
    book: Mutex<Book>,
}

impl FeedbackBook {
    /// Remembers answer `id` and counts its confidence (`None`: not measured).
    pub fn answered(&self, id: &str, answer: Answer, mean_logprob: Option<f64>) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let key = (answer.checkpoint.clone(), answer.arm_label());
        if let Some(x) = mean_logprob.filter(|x| x.is_finite()) {
            book.signals.entry(key).or_default().confidence.add(x);
        }
        if book
            .answers
            .insert(id.to_owned(), (answer, false))
            .is_none()
        {
            book.order.push_back(id.to_owned());
        }
        while book.order.len() > ANSWERS_KEPT {
            if let Some(old) = book.order.pop_front() {
                book.answers.remove(&old);
            }
        }
    }

    /// Scores answer `id` for `tenant` (the caller; `None`: anonymous).
    pub fn score(
        &self,
        id: &str,
        tenant: Option<&str>,
        score: f64,
    ) -> Result<Answer, FeedbackError> {
        if !(0.0..=1.0).contains(&score) {
            return Err(FeedbackError::ScoreOutOfRange(score));
        }
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let unknown = || FeedbackError::UnknownAnswer(id.to_owned());
        let (answer, scored) = book.answers.get_mut(id).ok_or_else(unknown)?;
        // Another caller's answer reads as unknown: ids must not reveal who asked what.
        if answer.tenant.as_deref() != tenant {
            return Err(unknown());
        }
        if *scored {
            return Err(FeedbackError::AlreadyScored(id.to_owned()));
        }
        *scored = true;
        let answer = answer.clone();
        let key = (answer.checkpoint.clone(), answer.arm_label());
        book.signals.entry(key).or_default().feedback.add(score);
        Ok(answer)
    }

    /// Every checkpoint's (and arm's) signals, sorted by checkpoint then arm.
    pub fn signals(&self) -> Vec<QualitySignals> {
        let book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        book.signals
            .iter()
            .map(|((checkpoint, arm), s)| QualitySignals {
                checkpoint: checkpoint.clone(),
                arm: arm.clone(),
                feedback: s.feedback.mean(),
                confidence: s.confidence.mean(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(checkpoint: &str, arm: Option<&str>, tenant: Option<&str>) -> Answer {
        Answer {
            checkpoint: checkpoint.into(),
            split_arm: arm
                .and_then(|a| a.split_once('/'))
                .map(|(s, a)| (s.into(), a.into())),
            tenant: tenant.map(Into::into),
        }
    }

    #[test]
    fn scores_count_once_for_the_caller_that_asked_per_checkpoint_and_arm() {
        let book = FeedbackBook::default();
        book.answered("a", answer("m@1", Some("s/base"), Some("acme")), Some(-0.5));
        book.answered(
            "b",
            answer("m@2", Some("s/canary"), Some("acme")),
            Some(-1.5),
        );
        book.answered("c", answer("m@1", Some("s/base"), Some("acme")), Some(-0.3));
        assert_eq!(
            book.score("a", Some("other"), 1.0),
            Err(FeedbackError::UnknownAnswer("a".into()))
        );
        assert_eq!(
            book.score("a", None, 1.0),
            Err(FeedbackError::UnknownAnswer("a".into()))
        );
        assert!(book.score("a", Some("acme"), 1.0).is_ok());
        assert_eq!(
            book.score("a", Some("acme"), 0.0),
            Err(FeedbackError::AlreadyScored("a".into()))
        );
        assert_eq!(
            book.score("c", Some("acme"), 1.5),
            Err(FeedbackError::ScoreOutOfRange(1.5))
        );
        assert!(book.score("c", Some("acme"), 0.5).is_ok());
        assert!(book.score("b", Some("acme"), 0.0).is_ok());
        let signals = book.signals();
        assert_eq!(signals.len(), 2);
        let base = &signals[0];
        assert_eq!(
            (base.checkpoint.as_str(), base.arm.as_deref()),
            ("m@1", Some("s/base"))
        );
        let feedback = base.feedback.unwrap();
        assert_eq!((feedback.n, feedback.mean), (2, 0.75));
        // Sample sd of {1, 0.5} is 0.3536; half-width 1.96 × 0.3536 / √2 = 0.49.
        assert!((feedback.ci95[1] - feedback.ci95[0] - 0.98).abs() < 1e-3);
        let confidence = base.confidence.unwrap();
        assert_eq!(confidence.n, 2);
        assert!((confidence.mean + 0.4).abs() < 1e-12);
        assert_eq!(signals[1].feedback.unwrap().mean, 0.0);
    }

    #[test]
    fn the_oldest_answers_are_forgotten() {
        let book = FeedbackBook::default();
        for i in 0..=ANSWERS_KEPT {
            book.answered(&i.to_string(), answer("m@1", None, None), None);
        }
        assert_eq!(
            book.score("0", None, 1.0),
            Err(FeedbackError::UnknownAnswer("0".into()))
        );
        assert!(book.score(&ANSWERS_KEPT.to_string(), None, 1.0).is_ok());
        assert_eq!(book.signals()[0].confidence, None);
    }
}
