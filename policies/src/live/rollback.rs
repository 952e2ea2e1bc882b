//! The automatic rollback rule of a split at work: watch the new arm against the old one
//! over a sliding window and, when it is clearly worse, pin all traffic to the old arm.
//!
//! "Worse" is read from operational signals (error rate, mean latency) and from quality
//! signals: the answers' mean token log-probability (measured by the engine on every
//! answer), the scores clients send (`POST /v1/feedback`), and the arms' stored
//! evaluations on a suite. A quality signal trips the rule only when the candidate's mean
//! is below the baseline's by more than the policy's margin *and* the gap is significant
//! (the 95% interval of the difference, Welch's normal approximation, excludes zero), so
//! a few unlucky answers do not roll a good version back.
//!
//! States: `Watching` → `RolledBack` (sticky until an operator resets it or the split is
//! changed in the policy file). Outcomes are kept in ten time buckets per arm, so the
//! window slides in steps of a tenth of its length.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::compiled::split::RollbackRule;
use crate::feedback::{Mean, Running};
use crate::metrics;

const BUCKETS: usize = 10;

/// Outcome counts of one arm over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmStats {
    /// Arm name.
    pub arm: String,
    /// Requests finished in the window.
    pub samples: u64,
    /// Of which failed.
    pub errors: u64,
    /// `errors / samples` (0 with no samples).
    pub error_rate: f64,
    /// Mean latency in milliseconds (0 with no samples).
    pub mean_latency_ms: f64,
    /// Mean token log-probability of the arm's answers, with its interval.
    pub confidence: Option<Mean>,
    /// Client scores of the arm's answers, with their interval.
    pub feedback: Option<Mean>,
}

/// Where the rule stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RollbackState {
    /// Comparing arms; traffic follows the split's weights.
    Watching,
    /// Tripped: all traffic goes to the baseline arm.
    RolledBack {
        /// The signal that tripped it: `errors`, `latency`, `confidence`, `feedback` or
        /// `eval`.
        signal: &'static str,
        /// Why it tripped, with the numbers.
        reason: String,
        /// When, in milliseconds since the Unix epoch.
        at_unix_ms: u64,
    },
}

/// Observable state of one split's rollback rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RollbackStatus {
    /// Split name.
    pub split: String,
    /// Watching or rolled back.
    pub state: RollbackState,
    /// The old arm over the window.
    pub baseline: ArmStats,
    /// The new arm over the window.
    pub candidate: ArmStats,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    slot: u64,
    samples: u64,
    errors: u64,
    latency_ms_sum: f64,
    confidence: Running,
    feedback: Running,
}

/// One observation of an arm.
#[derive(Debug, Clone, Copy)]
enum Observation {
    /// A finished request.
    Outcome { succeeded: bool, latency_ms: f64 },
    /// The mean token log-probability of an answer.
    Confidence(f64),
    /// A client's score of an answer.
    Feedback(f64),
}

#[derive(Debug)]
struct MonitorState {
    buckets: [[Bucket; BUCKETS]; 2],
    state: RollbackState,
}

/// Records outcomes per arm and trips the rule. Shared by `Arc` between the policy and
/// in-flight routes; kept across reloads while the split is unchanged.
#[derive(Debug)]
pub struct RollbackMonitor {
    split: Arc<str>,
    arm_names: [Arc<str>; 2],
    rule: RollbackRule,
    epoch: Instant,
    // Read on every routed request without taking the lock.
    tripped: AtomicBool,
    state: Mutex<MonitorState>,
}

impl RollbackMonitor {
    /// A monitor in the `Watching` state.
    pub fn new(
        split: Arc<str>,
        baseline: Arc<str>,
        candidate: Arc<str>,
        rule: RollbackRule,
    ) -> Self {
        RollbackMonitor {
            split,
            arm_names: [baseline, candidate],
            rule,
            epoch: Instant::now(),
            tripped: AtomicBool::new(false),
            state: Mutex::new(MonitorState {
                buckets: [[Bucket::default(); BUCKETS]; 2],
                state: RollbackState::Watching,
            }),
        }
    }

    /// The rule being applied.
    pub fn rule(&self) -> &RollbackRule {
        &self.rule
    }

    /// True once the rule has tripped (traffic pinned to the baseline arm).
    pub fn is_rolled_back(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Records one finished request on arm `arm` (other arms than baseline and candidate
    /// are ignored), then checks the rule.
    pub fn record(&self, arm: usize, succeeded: bool, latency_ms: f64) {
        self.record_at(arm, succeeded, latency_ms, Instant::now());
    }

    /// [`RollbackMonitor::record`] at a given instant (tests drive time with this).
    pub fn record_at(&self, arm: usize, succeeded: bool, latency_ms: f64, now: Instant) {
        let latency_ms = if latency_ms.is_finite() {
            latency_ms.max(0.0)
        } else {
            0.0
        };
        self.observe(
            arm,
            Observation::Outcome {
                succeeded,
                latency_ms,
            },
            now,
        );
    }

    /// Records the mean token log-probability of an answer arm `arm` gave.
    pub fn record_confidence(&self, arm: usize, mean_logprob: f64) {
        self.record_confidence_at(arm, mean_logprob, Instant::now());
    }

    /// [`RollbackMonitor::record_confidence`] at a given instant.
    pub fn record_confidence_at(&self, arm: usize, mean_logprob: f64, now: Instant) {
        if mean_logprob.is_finite() {
            self.observe(arm, Observation::Confidence(mean_logprob), now);
        }
    }

    /// Records a client's score (0..=1) of an answer arm `arm` gave.
    pub fn record_feedback(&self, arm: usize, score: f64) {
        self.record_feedback_at(arm, score, Instant::now());
    }

    /// [`RollbackMonitor::record_feedback`] at a given instant.
    pub fn record_feedback_at(&self, arm: usize, score: f64, now: Instant) {
        if score.is_finite() {
            self.observe(arm, Observation::Feedback(score), now);
        }
    }

    /// Trips the rule for a reason found outside the window (the arms' stored
    /// evaluations); no-op once tripped.
    pub fn trip(&self, signal: &'static str, reason: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(s.state, RollbackState::Watching) {
            self.trip_locked(&mut s, signal, reason);
        }
    }

    fn trip_locked(&self, s: &mut MonitorState, signal: &'static str, reason: String) {
        tracing::warn!(split = %self.split, signal, %reason, "rollback rule tripped; pinning traffic to the baseline arm");
        s.state = RollbackState::RolledBack {
            signal,
            reason,
            at_unix_ms: unix_ms(),
        };
        self.tripped.store(true, Ordering::Release);
        metrics::rollback_state(&self.split, true);
        metrics::rollback_tripped(&self.split, signal);
    }

    fn observe(&self, arm: usize, observation: Observation, now: Instant) {
        let which = if arm == self.rule.baseline {
            0
        } else if arm == self.rule.candidate {
            1
        } else {
            return;
        };
        let slot = self.slot(now);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let ring = (slot % BUCKETS as u64) as usize;
        let Some(bucket) = s.buckets.get_mut(which).and_then(|b| b.get_mut(ring)) else {
            return;
        };
        if bucket.slot != slot {
            *bucket = Bucket {
                slot,
                ..Bucket::default()
            };
        }
        match observation {
            Observation::Outcome {
                succeeded,
                latency_ms,
            } => {
                bucket.samples += 1;
                bucket.errors += u64::from(!succeeded);
                bucket.latency_ms_sum += latency_ms;
            }
            Observation::Confidence(x) => bucket.confidence.add(x),
            Observation::Feedback(x) => bucket.feedback.add(x),
        }
        if matches!(s.state, RollbackState::Watching) {
            let base = stats(&s.buckets[0], slot, &self.arm_names[0]);
            let cand = stats(&s.buckets[1], slot, &self.arm_names[1]);
            if let Some((signal, reason)) = self.verdict(&base, &cand) {
                self.trip_locked(&mut s, signal, reason);
            }
        }
    }

    /// Returns to `Watching` with empty windows (an operator decided the new arm is fine
    /// to try again).
    pub fn reset(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.buckets = [[Bucket::default(); BUCKETS]; 2];
        s.state = RollbackState::Watching;
        self.tripped.store(false, Ordering::Release);
        metrics::rollback_state(&self.split, false);
    }

    /// The state and both arms' window statistics now.
    pub fn status(&self) -> RollbackStatus {
        self.status_at(Instant::now())
    }

    /// [`RollbackMonitor::status`] at a given instant.
    pub fn status_at(&self, now: Instant) -> RollbackStatus {
        let slot = self.slot(now);
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        RollbackStatus {
            split: self.split.to_string(),
            state: s.state.clone(),
            baseline: stats(&s.buckets[0], slot, &self.arm_names[0]),
            candidate: stats(&s.buckets[1], slot, &self.arm_names[1]),
        }
    }

    fn slot(&self, now: Instant) -> u64 {
        let width = (self.rule.window.as_nanos() / BUCKETS as u128).max(1);
        (now.saturating_duration_since(self.epoch).as_nanos() / width) as u64
    }

    fn verdict(&self, base: &ArmStats, cand: &ArmStats) -> Option<(&'static str, String)> {
        let min = u64::from(self.rule.min_samples);
        if let Some(reason) = self.operational_verdict(base, cand, min) {
            return Some(reason);
        }
        let quality = [
            (
                "confidence",
                "mean token log-probability",
                self.rule.max_confidence_drop,
                base.confidence,
                cand.confidence,
            ),
            (
                "feedback",
                "mean client score",
                self.rule.max_feedback_drop,
                base.feedback,
                cand.feedback,
            ),
        ];
        for (signal, what, margin, b, c) in quality {
            let (Some(margin), Some(b), Some(c)) = (margin, b, c) else {
                continue;
            };
            if b.n < min || c.n < min {
                continue;
            }
            if let Some(drop) = significant_drop(&b, &c, margin) {
                return Some((
                    signal,
                    format!(
                        "{what} of arm `{}` is {:.3} against {:.3} on `{}` (a drop of {drop:.3}, allowed {margin}, significant at 95%) over {} and {} answers",
                        cand.arm, c.mean, b.mean, base.arm, c.n, b.n
                    ),
                ));
            }
        }
        None
    }

    fn operational_verdict(
        &self,
        base: &ArmStats,
        cand: &ArmStats,
        min: u64,
    ) -> Option<(&'static str, String)> {
        if base.samples < min || cand.samples < min {
            return None;
        }
        if let Some(limit) = self.rule.max_error_rate_increase {
            if cand.error_rate - base.error_rate > limit {
                return Some(("errors", format!(
                    "error rate of arm `{}` is {:.3} against {:.3} on `{}` (allowed increase {limit}) over {} and {} requests",
                    cand.arm, cand.error_rate, base.error_rate, base.arm, cand.samples, base.samples
                )));
            }
        }
        if let Some(ratio) = self.rule.max_latency_ratio {
            if cand.mean_latency_ms > base.mean_latency_ms * ratio {
                return Some(("latency", format!(
                    "mean latency of arm `{}` is {:.1} ms against {:.1} ms on `{}` (allowed ratio {ratio}) over {} and {} requests",
                    cand.arm, cand.mean_latency_ms, base.mean_latency_ms, base.arm, cand.samples, base.samples
                )));
            }
        }
        None
    }
}

/// The drop from `base` to `cand` when it exceeds `margin` and the 95% interval of the
/// difference (Welch, normal approximation) lies above zero.
fn significant_drop(base: &Mean, cand: &Mean, margin: f64) -> Option<f64> {
    let drop = base.mean - cand.mean;
    let se = (base.std_error().powi(2) + cand.std_error().powi(2)).sqrt();
    (drop > margin && drop - 1.96 * se > 0.0).then_some(drop)
}

/// Sums the buckets still inside the window ending at `slot`.
fn stats(buckets: &[Bucket; BUCKETS], slot: u64, arm: &str) -> ArmStats {
    let oldest = slot.saturating_sub(BUCKETS as u64 - 1);
    let (mut samples, mut errors, mut latency) = (0u64, 0u64, 0.0f64);
    let (mut confidence, mut feedback) = (Running::default(), Running::default());
    for b in buckets
        .iter()
        .filter(|b| b.slot >= oldest && b.slot <= slot)
    {
        samples += b.samples;
        errors += b.errors;
        latency += b.latency_ms_sum;
        confidence.merge(&b.confidence);
        feedback.merge(&b.feedback);
    }
    let n = samples.max(1) as f64;
    ArmStats {
        arm: arm.to_string(),
        samples,
        errors,
        error_rate: errors as f64 / n,
        mean_latency_ms: latency / n,
        confidence: confidence.mean(),
        feedback: feedback.mean(),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn monitor(min_samples: u32) -> RollbackMonitor {
        RollbackMonitor::new(
            "s".into(),
            "stable".into(),
            "canary".into(),
            RollbackRule {
                baseline: 0,
                candidate: 1,
                window: Duration::from_secs(60),
                min_samples,
                max_error_rate_increase: Some(0.1),
                max_latency_ratio: Some(2.0),
                max_confidence_drop: Some(0.5),
                max_feedback_drop: Some(0.2),
                eval: None,
            },
        )
    }

    #[test]
    fn trips_on_error_rate_once_both_arms_have_samples() {
        let m = monitor(10);
        let t = Instant::now();
        for _ in 0..10 {
            m.record_at(1, false, 10.0, t);
        }
        assert!(!m.is_rolled_back(), "baseline has no samples yet");
        for _ in 0..10 {
            m.record_at(0, true, 10.0, t);
        }
        assert!(m.is_rolled_back());
        assert!(matches!(
            m.status_at(t).state,
            RollbackState::RolledBack { .. }
        ));
        m.reset();
        assert!(!m.is_rolled_back());
        assert_eq!(m.status_at(t).candidate.samples, 0);
    }

    #[test]
    fn trips_on_latency_ratio() {
        let m = monitor(5);
        let t = Instant::now();
        for _ in 0..5 {
            m.record_at(0, true, 100.0, t);
            m.record_at(1, true, 250.0, t);
        }
        assert!(m.is_rolled_back());
    }

    #[test]
    fn similar_arms_keep_watching_and_old_outcomes_leave_the_window() {
        let m = monitor(5);
        let t = Instant::now();
        for i in 0..50 {
            m.record_at(0, i % 10 != 0, 100.0, t);
            m.record_at(1, i % 10 != 0, 110.0, t);
        }
        assert!(!m.is_rolled_back());
        let later = t + Duration::from_secs(120);
        assert_eq!(m.status_at(later).baseline.samples, 0);
        m.record_at(2, false, 1.0, t);
        assert_eq!(m.status_at(t).candidate.samples, 50);
    }

    #[test]
    fn trips_on_a_significant_confidence_drop_only() {
        let m = monitor(5);
        let t = Instant::now();
        // A drop of 0.6 > 0.5, but noisy: the interval of the difference holds zero.
        for i in 0..5 {
            let spread = if i % 2 == 0 { 2.0 } else { -2.0 };
            m.record_confidence_at(0, -1.0 + spread, t);
            m.record_confidence_at(1, -1.6 - spread, t);
        }
        assert!(!m.is_rolled_back(), "{:?}", m.status_at(t));
        // Steady answers: the same drop is significant.
        let m = monitor(5);
        for i in 0..5 {
            let wobble = f64::from(i) * 0.01;
            m.record_confidence_at(0, -1.0 - wobble, t);
            m.record_confidence_at(1, -1.6 - wobble, t);
        }
        let status = m.status_at(t);
        assert!(m.is_rolled_back(), "{status:?}");
        let RollbackState::RolledBack { signal, reason, .. } = status.state else {
            panic!("not rolled back");
        };
        assert_eq!(signal, "confidence");
        assert!(reason.starts_with("mean token log-probability of arm `canary` is -1.620 against -1.020 on `stable` (a drop of 0.600"), "{reason}");
        assert_eq!(status.candidate.confidence.map(|c| c.n), Some(5));
        // No error-rate or latency samples were needed.
        assert_eq!(status.candidate.samples, 0);
    }

    #[test]
    fn trips_on_client_scores_past_the_margin() {
        let m = monitor(4);
        let t = Instant::now();
        for _ in 0..4 {
            m.record_feedback_at(0, 1.0, t);
            m.record_feedback_at(1, 0.9, t);
        }
        assert!(!m.is_rolled_back(), "a drop of 0.1 is within 0.2");
        for _ in 0..4 {
            m.record_feedback_at(1, 0.0, t);
        }
        assert!(m.is_rolled_back());
        assert!(matches!(
            m.status_at(t).state,
            RollbackState::RolledBack {
                signal: "feedback",
                ..
            }
        ));
    }

    #[test]
    fn an_outside_reason_trips_once() {
        let m = monitor(5);
        m.trip("eval", "first".into());
        m.trip("eval", "second".into());
        let RollbackState::RolledBack { reason, .. } = m.status().state else {
            panic!("not rolled back");
        };
        assert_eq!(reason, "first");
    }
}
