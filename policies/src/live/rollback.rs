//! The automatic rollback rule of a split at work: watch the new arm against the old one
//! over a sliding window and, when it is clearly worse, pin all traffic to the old arm.
//!
//! States: `Watching` → `RolledBack` (sticky until an operator resets it or the split is
//! changed in the policy file). Outcomes are kept in ten time buckets per arm, so the
//! window slides in steps of a tenth of its length.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::compiled::split::RollbackRule;
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
}

/// Where the rule stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RollbackState {
    /// Comparing arms; traffic follows the split's weights.
    Watching,
    /// Tripped: all traffic goes to the baseline arm.
    RolledBack {
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
        bucket.samples += 1;
        bucket.errors += u64::from(!succeeded);
        bucket.latency_ms_sum += if latency_ms.is_finite() {
            latency_ms.max(0.0)
        } else {
            0.0
        };
        if matches!(s.state, RollbackState::Watching) {
            let base = stats(&s.buckets[0], slot, &self.arm_names[0]);
            let cand = stats(&s.buckets[1], slot, &self.arm_names[1]);
            if let Some(reason) = self.verdict(&base, &cand) {
                tracing::warn!(split = %self.split, %reason, "rollback rule tripped; pinning traffic to the baseline arm");
                s.state = RollbackState::RolledBack {
                    reason,
                    at_unix_ms: unix_ms(),
                };
                self.tripped.store(true, Ordering::Release);
                metrics::rollback_state(&self.split, true);
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

    fn verdict(&self, base: &ArmStats, cand: &ArmStats) -> Option<String> {
        let min = u64::from(self.rule.min_samples);
        if base.samples < min || cand.samples < min {
            return None;
        }
        if let Some(limit) = self.rule.max_error_rate_increase {
            if cand.error_rate - base.error_rate > limit {
                return Some(format!(
                    "error rate of arm `{}` is {:.3} against {:.3} on `{}` (allowed increase {limit}) over {} and {} requests",
                    cand.arm, cand.error_rate, base.error_rate, base.arm, cand.samples, base.samples
                ));
            }
        }
        if let Some(ratio) = self.rule.max_latency_ratio {
            if cand.mean_latency_ms > base.mean_latency_ms * ratio {
                return Some(format!(
                    "mean latency of arm `{}` is {:.1} ms against {:.1} ms on `{}` (allowed ratio {ratio}) over {} and {} requests",
                    cand.arm, cand.mean_latency_ms, base.mean_latency_ms, base.arm, cand.samples, base.samples
                ));
            }
        }
        None
    }
}

/// Sums the buckets still inside the window ending at `slot`.
fn stats(buckets: &[Bucket; BUCKETS], slot: u64, arm: &str) -> ArmStats {
    let oldest = slot.saturating_sub(BUCKETS as u64 - 1);
    let (mut samples, mut errors, mut latency) = (0u64, 0u64, 0.0f64);
    for b in buckets
        .iter()
        .filter(|b| b.samples > 0 && b.slot >= oldest && b.slot <= slot)
    {
        samples += b.samples;
        errors += b.errors;
        latency += b.latency_ms_sum;
    }
    let n = samples.max(1) as f64;
    ArmStats {
        arm: arm.to_string(),
        samples,
        errors,
        error_rate: errors as f64 / n,
        mean_latency_ms: latency / n,
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
}
