//! Which resident version to evict when a load needs room.
//!
//! A version is worth keeping in proportion to the demand on it (requests
//! queued or running), to what reloading it would cost (its bytes), and to
//! how recently it was used. The active version of a model is never
//! evicted: requests for the model always find it resident.

use std::time::Duration;

/// A resident, non-active version that could be evicted.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionCandidate {
    /// An index the caller maps back to the version.
    pub index: usize,
    /// Requests waiting or running on it.
    pub demand: usize,
    /// Bytes it would free (its tensors no other checkpoint shares).
    pub bytes: u64,
    /// Time since a request last used it.
    pub idle: Duration,
}

/// Reading speed assumed to estimate reload cost: about 1 GB/s.
const RELOAD_BYTES_PER_MS: f64 = 1.0e6;

/// How much keeping `candidate` is worth; lowest is evicted first.
fn keep_value(candidate: &EvictionCandidate) -> f64 {
    let reload_ms = candidate.bytes as f64 / RELOAD_BYTES_PER_MS;
    let demand = candidate.demand as f64 * 1e6;
    (demand + reload_ms + 1.0) / (1.0 + candidate.idle.as_secs_f64())
}

/// `candidates` in the order they should be evicted.
pub fn eviction_order(mut candidates: Vec<EvictionCandidate>) -> Vec<EvictionCandidate> {
    candidates.sort_by(|a, b| {
        keep_value(a)
            .total_cmp(&keep_value(b))
            .then(a.index.cmp(&b.index))
    });
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(index: usize, demand: usize, bytes: u64, idle_s: u64) -> EvictionCandidate {
        EvictionCandidate {
            index,
            demand,
            bytes,
            idle: Duration::from_secs(idle_s),
        }
    }

    #[test]
    fn idle_versions_go_before_busy_ones() {
        let order = eviction_order(vec![candidate(0, 3, 100, 0), candidate(1, 0, 100, 60)]);
        assert_eq!(order[0].index, 1);
    }

    #[test]
    fn among_idle_versions_the_least_recently_used_goes_first() {
        let order = eviction_order(vec![candidate(0, 0, 100, 5), candidate(1, 0, 100, 500)]);
        assert_eq!(order[0].index, 1);
    }

    #[test]
    fn a_cheap_reload_goes_before_an_expensive_one_used_as_recently() {
        let order = eviction_order(vec![
            candidate(0, 0, 4_000_000_000, 10),
            candidate(1, 0, 1_000_000, 10),
        ]);
        assert_eq!(order[0].index, 1);
    }
}
