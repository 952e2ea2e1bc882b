//! One sequence's draft length and whether it drafts at all, from its
//! measured acceptance.
//!
//! A verify row costs a fraction of a step (on the CPU a decode step reads
//! every weight once whatever its rows; each row adds its arithmetic), so
//! drafts pay while most of their tokens are kept. The length doubles
//! after a fully kept draft and falls to one past the kept prefix after a
//! miss. An exponential moving average of the acceptance rate below
//! [`OFF_BELOW`] turns drafting off for a number of drafts that doubles
//! each time (up to [`MAX_PAUSE`]): free text keeps paying nearly nothing,
//! and a sequence that turns to copying is found again within a pause.
//!
//! A pause counts drafts the sequence could have verified, not steps: in
//! free text a lookup finds something only every dozen tokens or so, and
//! a pause of steps would have run out before the next guess came.

/// Acceptance (kept over drafted tokens, averaged) under which drafting pauses.
pub const OFF_BELOW: f64 = 0.35;
/// The longest pause, in drafts skipped.
pub const MAX_PAUSE: u32 = 64;
/// Weight of the newest verify step in the average.
const SMOOTHING: f64 = 0.3;

/// Draft length and on/off for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftControl {
    max_draft: usize,
    /// The next draft's length.
    length: usize,
    /// Average acceptance rate over recent verify steps.
    acceptance: f64,
    /// Drafts left to skip.
    paused: u32,
    /// The next pause's length.
    next_pause: u32,
}

impl DraftControl {
    /// A controller whose drafts are at most `max_draft` tokens.
    pub fn new(max_draft: usize) -> Self {
        let max_draft = max_draft.max(1);
        DraftControl {
            max_draft,
            length: max_draft.min(4),
            // Optimistic: the first drafts are tried at once.
            acceptance: 1.0,
            paused: 0,
            next_pause: 2,
        }
    }

    /// How many tokens the next draft may have.
    pub fn wanted(&self) -> usize {
        self.length
    }

    /// Whether a draft that is to be had now is verified (false while
    /// paused: the skipped draft counts the pause down). Asked only when
    /// a draft exists, so that steps without one leave the pause as is.
    pub fn allows(&mut self) -> bool {
        if self.paused > 0 {
            self.paused -= 1;
            return false;
        }
        true
    }

    /// A verify step kept `accepted` of `drafted` tokens.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let rate = accepted as f64 / drafted as f64;
        self.acceptance = SMOOTHING * rate + (1.0 - SMOOTHING) * self.acceptance;
        self.length = if accepted >= drafted {
            (self.length * 2).min(self.max_draft)
        } else {
            (accepted + 1).min(self.max_draft)
        };
        if self.acceptance < OFF_BELOW {
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            // Back from a pause on probation: one bad step pauses again.
            self.acceptance = OFF_BELOW;
        } else if rate >= 0.5 {
            self.next_pause = 2;
        }
    }

    /// The measured acceptance rate (recent steps weigh most).
    pub fn acceptance(&self) -> f64 {
        self.acceptance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_drafts_grow_and_a_miss_shortens_them() {
        let mut control = DraftControl::new(16);
        assert!(control.allows());
        assert_eq!(control.wanted(), 4);
        control.record(4, 4);
        assert_eq!(control.wanted(), 8);
        control.record(8, 8);
        control.record(16, 16);
        assert_eq!(control.wanted(), 16);
        control.record(16, 5);
        assert_eq!(control.wanted(), 6);
    }

    #[test]
    fn low_acceptance_pauses_for_longer_each_time() {
        let mut control = DraftControl::new(8);
        let mut pauses = Vec::new();
        for _ in 0..4 {
            // Miss until drafting pauses, then count the skipped drafts.
            while control.allows() {
                control.record(1, 0);
            }
            let mut paused = 1;
            while !control.allows() {
                paused += 1;
            }
            pauses.push(paused);
        }
        assert_eq!(pauses, vec![2, 4, 8, 16]);
        // Good drafts again: the next pause is short.
        control.record(2, 2);
        control.record(4, 4);
        assert!(control.acceptance() > OFF_BELOW);
        while control.allows() {
            control.record(1, 0);
        }
        let mut paused = 1;
        while !control.allows() {
            paused += 1;
        }
        assert_eq!(paused, 2);
    }

    #[test]
    fn a_pause_lasts_until_drafts_are_skipped_however_many_steps_pass() {
        let mut control = DraftControl::new(8);
        while control.allows() {
            control.record(1, 0);
        }
        // Steps without a draft to be had never ask, so they leave the
        // pause as it is: the next found draft is still skipped.
        for _ in 0..1_000 {
            assert_eq!(control.wanted(), 1);
        }
        assert!(!control.allows());
    }

    #[test]
    fn pauses_are_bounded() {
        let mut control = DraftControl::new(8);
        for _ in 0..10_000 {
            if control.allows() {
                control.record(1, 0);
            }
        }
        assert!(control.next_pause <= MAX_PAUSE);
    }
}
