//! Which checkpoint's batch runs next.
//!
//! Every checkpoint with work competes each step. Its claim grows with the
//! time since it last ran (so no queue starves: a waiting checkpoint's
//! claim grows without bound while the running one's resets every step),
//! with the rows it would run (a bigger batch amortizes the step better),
//! and sharply as a request's deadline nears. Switching away from the
//! current weights costs a small fixed penalty, so that equal claims keep
//! the resident table and batches stay together.
//!
//! Checkpoints that share their steps (a base and its LoRA adapters: one
//! set of base weights, each adapter's update on its own rows) run
//! together whichever of them leads, so they claim as one ([`family`]):
//! their rows add up, the oldest wait counts, and an adapter joining the
//! base already in the table is no swap. Sixteen adapters with one request
//! each are one 16-row batch, not sixteen 1-row claims.

use std::time::{Duration, Instant};

/// What the scheduler knows of one checkpoint's work at decision time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claim {
    /// When it last ran a step, or when its oldest request arrived.
    pub waiting_since: Instant,
    /// Rows its next step would run (decode rows plus prompt tokens).
    pub rows: usize,
    /// The earliest deadline among its requests, if any has one.
    pub deadline: Option<Instant>,
    /// Whether its weights are the current table (no swap needed).
    pub current: bool,
}

/// The cost of a swap between resident checkpoints, in the same unit as
/// waiting (milliseconds): microseconds in fact, but a switch also breaks
/// cache locality, so ties stay put.
const SWAP_PENALTY_MS: f64 = 0.05;

/// A deadline closer than this makes the claim urgent.
const URGENT_WITHIN: Duration = Duration::from_secs(2);

/// How strongly `claim` asks to run now. Higher wins.
pub fn score(claim: &Claim, now: Instant) -> f64 {
    let waited_ms = now
        .saturating_duration_since(claim.waiting_since)
        .as_secs_f64()
        * 1e3;
    // Diminishing returns: 64 rows are worth ~4x one row, not 64x, so a
    // small queue is never starved by a big one for long.
    let batch_weight = 1.0 + (claim.rows as f64).ln_1p();
    let mut score = (waited_ms + 1.0) * batch_weight;
    if let Some(deadline) = claim.deadline {
        let slack = deadline.saturating_duration_since(now);
        if slack < URGENT_WITHIN {
            score += (URGENT_WITHIN - slack).as_secs_f64() * 1e6;
        }
    }
    if !claim.current {
        score -= SWAP_PENALTY_MS * batch_weight;
    }
    score
}

/// The claim of checkpoints that run in one step ([`Claim`]s of a base and
/// its adapters): their rows summed, the longest wait, the nearest
/// deadline, current if any of them is in the table. `None` when empty.
pub fn family(members: &[Claim]) -> Option<Claim> {
    let first = members.first()?;
    Some(members.iter().skip(1).fold(*first, |family, m| Claim {
        waiting_since: family.waiting_since.min(m.waiting_since),
        rows: family.rows + m.rows,
        deadline: match (family.deadline, m.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        current: family.current || m.current,
    }))
}

/// The index of the claim that runs next; ties go to the earliest index
/// (the caller keeps claims in a stable order).
pub fn choose(claims: &[Claim], now: Instant) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (index, claim) in claims.iter().enumerate() {
        let score = score(claim, now);
        if best.is_none_or(|(_, top)| score > top) {
            best = Some((index, score));
        }
    }
    best.map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(now: Instant, waited_ms: u64, rows: usize, current: bool) -> Claim {
        Claim {
            waiting_since: now - Duration::from_millis(waited_ms),
            rows,
            deadline: None,
            current,
        }
    }

    #[test]
    fn the_longest_waiting_checkpoint_runs_when_batches_are_alike() {
        let now = Instant::now() + Duration::from_secs(10);
        let claims = [claim(now, 5, 8, true), claim(now, 40, 8, false)];
        assert_eq!(choose(&claims, now), Some(1));
    }

    #[test]
    fn equal_claims_keep_the_current_weights() {
        let now = Instant::now() + Duration::from_secs(10);
        let claims = [claim(now, 10, 8, false), claim(now, 10, 8, true)];
        assert_eq!(choose(&claims, now), Some(1));
    }

    #[test]
    fn a_single_row_is_not_starved_by_a_big_batch() {
        // The big batch runs every step (waiting ~step time, 20 ms); the
        // single row's wait grows until it wins within a few steps.
        let now = Instant::now() + Duration::from_secs(10);
        let mut waited = 20;
        loop {
            let claims = [claim(now, 20, 64, true), claim(now, waited, 1, false)];
            if choose(&claims, now) == Some(1) {
                break;
            }
            waited += 20;
            assert!(waited < 200, "the single row still waits after {waited} ms");
        }
    }

    #[test]
    fn a_near_deadline_wins() {
        let now = Instant::now() + Duration::from_secs(10);
        let mut urgent = claim(now, 1, 1, false);
        urgent.deadline = Some(now + Duration::from_millis(100));
        let claims = [claim(now, 500, 64, true), urgent];
        assert_eq!(choose(&claims, now), Some(1));
    }

    #[test]
    fn adapters_over_one_base_claim_as_one_batch() {
        // Sixteen adapters of one base, a request each, against another
        // model's batch of four that waited as long: apart, each 1-row
        // adapter loses to the 4-row batch; as one family they win.
        let now = Instant::now() + Duration::from_secs(10);
        let adapters: Vec<Claim> = (0..16).map(|_| claim(now, 30, 1, false)).collect();
        let other = claim(now, 30, 4, false);
        let apart: Vec<Claim> = std::iter::once(other).chain(adapters.clone()).collect();
        assert_eq!(choose(&apart, now), Some(0));
        let together = family(&adapters).expect("a family of sixteen claims");
        assert_eq!(together.rows, 16);
        assert_eq!(choose(&[other, together], now), Some(1));
    }

    #[test]
    fn a_family_waits_as_its_oldest_member_and_is_current_with_any() {
        let now = Instant::now() + Duration::from_secs(10);
        let mut old = claim(now, 90, 1, false);
        old.deadline = Some(now + Duration::from_secs(5));
        let mut held = claim(now, 10, 2, true);
        held.deadline = Some(now + Duration::from_secs(3));
        let f = family(&[held, old]).expect("a family of two claims");
        assert_eq!(f.waiting_since, old.waiting_since);
        assert_eq!(f.deadline, held.deadline);
        assert!(f.current);
        assert_eq!(f.rows, 3);
        assert_eq!(family(&[]), None);
    }

    #[test]
    fn nothing_to_choose_from() {
        assert_eq!(choose(&[], Instant::now()), None);
    }
}
