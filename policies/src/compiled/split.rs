//! Traffic splits: weighted A/B tests and canaries between versions or models, with
//! sticky assignment by a stable hash and an optional automatic rollback rule.
//!
//! An arm is chosen by hashing `(split name, sticky key)` to a point in
//! `[0, total weight)` and taking the arm whose cumulative weight range holds it, so the
//! same user stays on the same arm for as long as the split's arms and weights are
//! unchanged, and the share of users per arm converges to the weights. Whether the rule
//! has tripped is live state, watched by a [`crate::RollbackMonitor`].

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

/// What keeps a caller on one arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sticky {
    /// The request's `user` field (then the API key, then the tenant).
    User,
    /// The API key (then the tenant).
    Key,
    /// Not sticky: each request is assigned on its own `request_id`.
    None,
}

/// One arm: a checkpoint and its share of traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// Arm name (reported in routes and metrics).
    pub name: Arc<str>,
    /// Model index.
    pub model: usize,
    /// Version index within that model.
    pub version: usize,
    /// Relative weight (the file's weights sum to 100).
    pub weight: f64,
}

/// When the new arm of a split counts as worse than the old one.
#[derive(Debug, Clone, PartialEq)]
pub struct RollbackRule {
    /// Arm index of the old (trusted) arm.
    pub baseline: usize,
    /// Arm index of the new arm under watch.
    pub candidate: usize,
    /// How far back outcomes count.
    pub window: Duration,
    /// Outcomes each arm needs in the window before the rule may trip.
    pub min_samples: u32,
    /// Trip when candidate error rate exceeds baseline error rate by more than this.
    pub max_error_rate_increase: Option<f64>,
    /// Trip when candidate mean latency exceeds baseline mean latency times this.
    pub max_latency_ratio: Option<f64>,
    /// Trip when the candidate's answers are less sure than the baseline's: their mean
    /// token log-probability (nats) is lower by more than this, significantly.
    pub max_confidence_drop: Option<f64>,
    /// Trip when the candidate's client scores (`POST /v1/feedback`, 0..=1) average
    /// lower than the baseline's by more than this, significantly.
    pub max_feedback_drop: Option<f64>,
    /// Trip when the candidate checkpoint's stored evaluation on a suite is below the
    /// baseline checkpoint's by more than the margin.
    pub eval: Option<EvalDrop>,
}

/// The evaluation part of a rollback rule: both arms' stored measurements on `suite`
/// (`switchyard eval --save`) are compared whenever the policy reads measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalDrop {
    /// The suite's name (its file stem), as `quality_from` names one.
    pub suite: String,
    /// The largest accuracy drop allowed.
    pub max_drop: f64,
}

/// A split of one model's traffic between arms.
#[derive(Debug)]
pub struct Split {
    /// Unique name; also salts the hash so different splits assign independently.
    pub name: Arc<str>,
    /// Model index whose requests this split decides.
    pub model: usize,
    /// What keeps a caller on one arm.
    pub sticky: Sticky,
    /// Arms in file order.
    pub arms: Vec<Arm>,
    /// Cumulative weights, `cumulative[i] = arms[0..=i].weight` summed.
    cumulative: Vec<f64>,
    /// The hash state after the split's name (see [`stable_hash`]), computed once.
    salt: u64,
    rollback: Option<RollbackRule>,
    /// Why the arms' stored evaluations call for a rollback (the rule's `eval` part, as
    /// last resolved against the measurements); `None`: they do not, or are not known.
    pub(crate) eval_verdict: Option<String>,
}

impl Split {
    /// A split over `arms` (at least one with positive weight, checked by validation).
    pub fn new(
        name: Arc<str>,
        model: usize,
        sticky: Sticky,
        arms: Vec<Arm>,
        rollback: Option<RollbackRule>,
    ) -> Self {
        let cumulative = arms
            .iter()
            .scan(0.0, |sum, a| {
                *sum += a.weight;
                Some(*sum)
            })
            .collect();
        Split {
            salt: salt_state(&name),
            name,
            model,
            sticky,
            arms,
            cumulative,
            rollback,
            eval_verdict: None,
        }
    }

    /// The rollback rule, if the split has one.
    pub fn rollback(&self) -> Option<&RollbackRule> {
        self.rollback.as_ref()
    }

    /// The arm the weights give a sticky key. (Routing sends a split whose rollback rule
    /// has tripped to the baseline arm without asking.)
    pub fn assign(&self, sticky_key: &str) -> usize {
        self.arm_for_hash(salted_hash(self.salt, sticky_key))
    }

    fn arm_for_hash(&self, hash: u64) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(0.0);
        // 53 high bits give a uniform point in [0, 1) exactly representable as f64.
        let point = (hash >> 11) as f64 / (1u64 << 53) as f64 * total;
        self.cumulative
            .iter()
            .position(|&c| point < c)
            // Rounding can leave `point == total`; the last positive-weight arm takes it.
            .or_else(|| self.arms.iter().rposition(|a| a.weight > 0.0))
            .unwrap_or(0)
    }

    /// Same name, arms, weights, stickiness and rollback rule: state may carry over.
    pub(crate) fn same_config(&self, other: &Split) -> bool {
        self.name == other.name
            && self.model == other.model
            && self.sticky == other.sticky
            && self.arms == other.arms
            && self.rollback == other.rollback
    }
}

/// A stable 64-bit hash of `(salt, key)`: FNV-1a over both (with a separator) followed by
/// the SplitMix64 finalizer, so nearby keys spread evenly. Stable across runs and builds,
/// unlike `std`'s randomly keyed hasher.
pub fn stable_hash(salt: &str, key: &str) -> u64 {
    salted_hash(salt_state(salt), key)
}

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The FNV-1a state after `salt` and the separator: a split computes it once, and each
/// request hashes only its key ([`salted_hash`]).
fn salt_state(salt: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    fnv(OFFSET, salt.as_bytes().iter().chain(&[0xff]))
}

/// [`stable_hash`] of `key` from a [`salt_state`].
fn salted_hash(state: u64, key: &str) -> u64 {
    let mut h = fnv(state, key.as_bytes());
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn fnv<'a>(mut h: u64, bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(name: &str, weight: f64) -> Arm {
        Arm {
            name: name.into(),
            model: 0,
            version: 0,
            weight,
        }
    }

    #[test]
    fn zero_weight_arms_get_nothing() {
        let s = Split::new(
            "s".into(),
            0,
            Sticky::User,
            vec![arm("a", 0.0), arm("b", 100.0)],
            None,
        );
        for i in 0..1000 {
            assert_eq!(s.assign(&i.to_string()), 1);
        }
        assert_eq!(s.arm_for_hash(u64::MAX), 1);
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(
            stable_hash("split", "user-1"),
            stable_hash("split", "user-1")
        );
        assert_ne!(
            stable_hash("split", "user-1"),
            stable_hash("split", "user-2")
        );
        assert_ne!(stable_hash("a", "bc"), stable_hash("ab", "c"));
        // Pinned: sticky assignments must survive upgrades, so the hash never changes.
        assert_eq!(stable_hash("split", "user-1"), 0x13bc_cf16_22d8_92f3);
    }

    #[test]
    fn assignment_hashes_name_and_key() {
        let s = Split::new(
            "canary".into(),
            0,
            Sticky::User,
            vec![arm("a", 50.0), arm("b", 50.0)],
            None,
        );
        for i in 0..200 {
            let key = format!("user-{i}");
            assert_eq!(s.assign(&key), s.arm_for_hash(stable_hash("canary", &key)));
        }
    }
}
