//! The in-process rate ledger: one fixed one-minute window per subject.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::{Quota, RateClaim, RateDecision, RateLedger, RateSubject, RATE_WINDOW};

/// A subject's current window.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When it started (ms); it ends [`RATE_WINDOW`] later.
    start_ms: u64,
    requests: u64,
    tokens: u64,
}

/// Counts in this process's memory. One lock for all subjects: a request's claims
/// (its tenant and its key) are checked and counted together.
#[derive(Debug, Default)]
pub struct LocalRateLedger {
    windows: Mutex<HashMap<RateSubject, Window>>,
}

fn window_ms() -> u64 {
    RATE_WINDOW.as_millis() as u64
}

impl Window {
    fn fresh(now_ms: u64) -> Self {
        Window {
            start_ms: now_ms,
            requests: 0,
            tokens: 0,
        }
    }

    fn reset(&self, now_ms: u64) -> Duration {
        Duration::from_millis((self.start_ms + window_ms()).saturating_sub(now_ms))
    }

    /// Whether one more request of `tokens` fits `claim`'s limits.
    fn fits(&self, claim: &RateClaim) -> bool {
        let requests_fit = claim
            .limits
            .requests_per_minute
            .is_none_or(|limit| self.requests < limit);
        let tokens_fit = claim
            .limits
            .tokens_per_minute
            .is_none_or(|limit| self.tokens.saturating_add(claim.tokens) <= limit);
        requests_fit && tokens_fit
    }
}

impl RateLedger for LocalRateLedger {
    fn take(&self, claims: &[RateClaim], now_ms: u64) -> RateDecision {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        // Each claim's window as of now (a window a minute old starts again).
        let current: Vec<Window> = claims
            .iter()
            .map(|claim| match windows.get(&claim.subject) {
                Some(w) if now_ms < w.start_ms + window_ms() => *w,
                _ => Window::fresh(now_ms),
            })
            .collect();
        let allowed = claims.iter().zip(&current).all(|(c, w)| w.fits(c));
        let mut decision = RateDecision {
            allowed,
            ..RateDecision::default()
        };
        for (claim, mut window) in claims.iter().zip(current) {
            if allowed {
                window.requests += 1;
                window.tokens = window.tokens.saturating_add(claim.tokens);
                windows.insert(claim.subject.clone(), window);
            } else if !window.fits(claim) {
                decision.retry_after = decision.retry_after.max(window.reset(now_ms));
            }
            let reset = window.reset(now_ms);
            if let Some(limit) = claim.limits.requests_per_minute {
                let quota = Quota {
                    limit,
                    remaining: limit.saturating_sub(window.requests),
                    reset,
                };
                decision.requests = Quota::tighter(decision.requests, quota);
            }
            if let Some(limit) = claim.limits.tokens_per_minute {
                let quota = Quota {
                    limit,
                    remaining: limit.saturating_sub(window.tokens),
                    reset,
                };
                decision.tokens = Quota::tighter(decision.tokens, quota);
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::compiled::rate_limit::RateLimits;

    fn claim(subject: RateSubject, rpm: Option<u64>, tpm: Option<u64>, tokens: u64) -> RateClaim {
        RateClaim {
            subject,
            limits: RateLimits {
                requests_per_minute: rpm,
                tokens_per_minute: tpm,
            },
            tokens,
        }
    }

    #[test]
    fn the_request_past_the_limit_is_refused_until_the_window_ends() {
        let ledger = LocalRateLedger::default();
        let tenant = [claim(RateSubject::Tenant(Arc::from("a")), Some(3), None, 0)];
        for (i, at) in [0, 10_000, 20_000].into_iter().enumerate() {
            let d = ledger.take(&tenant, at);
            assert!(d.allowed);
            assert_eq!(d.requests.map(|q| q.remaining), Some(2 - i as u64));
        }
        let refused = ledger.take(&tenant, 30_000);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_secs(30));
        assert_eq!(
            refused.requests.map(|q| q.reset),
            Some(Duration::from_secs(30))
        );
        assert!(ledger.take(&tenant, 60_000).allowed);
    }

    #[test]
    fn a_claim_without_room_counts_nothing_against_the_others() {
        let ledger = LocalRateLedger::default();
        let tenant = RateSubject::Tenant(Arc::from("a"));
        let key = RateSubject::Key([7; 32]);
        let both = |tokens| {
            [
                claim(tenant.clone(), Some(10), Some(1_000), tokens),
                claim(key.clone(), None, Some(300), tokens),
            ]
        };
        assert!(ledger.take(&both(200), 0).allowed);
        // The key has 100 tokens left: refused, the tenant's count unchanged.
        let refused = ledger.take(&both(200), 1);
        assert!(!refused.allowed);
        assert_eq!(refused.tokens.map(|q| q.remaining), Some(100), "the key's");
        assert_eq!(refused.requests.map(|q| q.remaining), Some(9));
        let fits = ledger.take(&both(100), 2);
        assert!(fits.allowed);
        assert_eq!(fits.tokens.map(|q| q.remaining), Some(0));
    }
}
