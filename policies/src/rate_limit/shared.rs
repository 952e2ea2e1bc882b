//! Rate limits counted in the spend ledger that instances share (issue 38's Redis
//! store), so that several instances behind one balancer hold a tenant to one
//! requests-per-minute and tokens-per-minute limit, not one each.
//!
//! Each subject's limit of each kind is a ledger window of one clock minute
//! (`rate:tenant:<name>:requests`, `rate:key:<digest hex>:tokens`, the window's
//! index the Unix minute): a request holds 1 request and its tokens on every window
//! of its claims at once, all or nothing ([`Ledger::reserve`], one Redis script), and
//! settles them at once, so the count is the ledger's, atomic across instances.
//! Windows here are clock minutes (the same on every instance); the in-process
//! [`super::LocalRateLedger`] starts a subject's minute at its first request.
//!
//! While the store cannot be reached, requests are counted by this instance alone
//! (a [`super::LocalRateLedger`]): the limits still hold per instance, and no request
//! is refused for the outage itself. (A fail-open store lets the hold through
//! unheld; the first window it cannot read then sends the request to the local
//! count too, and its queued settlement is replayed when the store is back.)

use std::sync::Arc;
use std::time::Duration;

use super::{Quota, RateClaim, RateDecision, RateLedger, RateSubject, RATE_WINDOW};
use crate::keys::hex;
use crate::ledger::{new_hold_id, Hold, Ledger, LedgerError, WindowId};

/// Rate limits kept in a shared [`Ledger`].
#[derive(Debug)]
pub struct SharedRateLedger {
    ledger: Arc<dyn Ledger>,
    /// Counts while the ledger is unreachable.
    fallback: super::local::LocalRateLedger,
}

impl SharedRateLedger {
    /// Counts in `ledger` (a store shared between instances).
    pub fn new(ledger: Arc<dyn Ledger>) -> Self {
        SharedRateLedger {
            ledger,
            fallback: super::local::LocalRateLedger::default(),
        }
    }
}

/// Which limit a ledger window counts.
#[derive(Clone, Copy)]
enum Kind {
    Requests,
    Tokens,
}

/// One window a request holds on: which kind of limit it counts, and the hold.
struct Counted {
    kind: Kind,
    hold: Hold,
}

fn subject_key(subject: &RateSubject) -> String {
    match subject {
        RateSubject::Tenant(name) => format!("rate:tenant:{name}"),
        RateSubject::Key(digest) => format!("rate:key:{}", hex(digest)),
    }
}

/// The holds `claims` take in the minute of `now_ms`.
fn holds(claims: &[RateClaim], now_ms: u64) -> Vec<Counted> {
    let window_ms = RATE_WINDOW.as_millis() as u64;
    let index = now_ms / window_ms;
    let ends_at = (index + 1) * window_ms / 1000;
    let window = |key: String| WindowId {
        key: key.into(),
        index,
        ends_at,
    };
    let mut counted = Vec::with_capacity(claims.len() * 2);
    for claim in claims {
        let key = subject_key(&claim.subject);
        if let Some(limit) = claim.limits.requests_per_minute {
            counted.push(Counted {
                kind: Kind::Requests,
                hold: Hold {
                    window: window(format!("{key}:requests")),
                    limit: limit as f64,
                    amount: 1.0,
                },
            });
        }
        if let Some(limit) = claim.limits.tokens_per_minute {
            counted.push(Counted {
                kind: Kind::Tokens,
                hold: Hold {
                    window: window(format!("{key}:tokens")),
                    limit: limit as f64,
                    amount: claim.tokens as f64,
                },
            });
        }
    }
    counted
}

impl RateLedger for SharedRateLedger {
    fn take(&self, claims: &[RateClaim], now_ms: u64) -> RateDecision {
        let counted = holds(claims, now_ms);
        let reset = Duration::from_millis(
            counted
                .first()
                .map_or(0, |c| (c.hold.window.ends_at * 1000).saturating_sub(now_ms)),
        );
        let all: Vec<Hold> = counted.iter().map(|c| c.hold.clone()).collect();
        let id = new_hold_id();
        let (allowed, short) = match self.ledger.reserve(id, &all) {
            Ok(()) => {
                let spent: Vec<(WindowId, f64)> =
                    all.iter().map(|h| (h.window.clone(), h.amount)).collect();
                if let Err(error) = self.ledger.settle(id, &spent, None) {
                    // Still held: the count stands until the hold expires.
                    tracing::warn!(%error, "a rate-limit count was held but not settled");
                }
                (true, None)
            }
            Err(LedgerError::Short { hold, remaining }) => (false, Some((hold, remaining))),
            Err(LedgerError::Unavailable { .. }) => return self.fallback.take(claims, now_ms),
        };
        let mut decision = RateDecision {
            allowed,
            retry_after: if allowed { Duration::ZERO } else { reset },
            ..RateDecision::default()
        };
        for (i, c) in counted.iter().enumerate() {
            let remaining = match short {
                Some((hold, remaining)) if hold == i => remaining,
                _ => match self.ledger.totals(&c.hold.window) {
                    Ok(t) => c.hold.limit - t.settled - t.reserved,
                    Err(LedgerError::Unavailable { .. }) => {
                        return self.fallback.take(claims, now_ms);
                    }
                    // Unknown: as if this request's count were all that was used.
                    Err(_) => c.hold.limit - c.hold.amount,
                },
            };
            let quota = Quota {
                limit: c.hold.limit as u64,
                remaining: remaining.max(0.0).round() as u64,
                reset,
            };
            match c.kind {
                Kind::Requests => decision.requests = Quota::tighter(decision.requests, quota),
                Kind::Tokens => decision.tokens = Quota::tighter(decision.tokens, quota),
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiled::rate_limit::RateLimits;
    use crate::ledger::MemoryLedger;

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

    /// Two instances on one store share the tenant's limit; a new clock minute
    /// starts it again.
    #[test]
    fn two_ledgers_on_one_store_share_a_tenants_minute() {
        let store: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
        let first = SharedRateLedger::new(Arc::clone(&store));
        let second = SharedRateLedger::new(store);
        let tenant = [claim(
            RateSubject::Tenant(Arc::from("a")),
            Some(3),
            Some(100),
            30,
        )];
        let minute = 60_000 * 1_000;
        let d = first.take(&tenant, minute);
        assert!(d.allowed);
        assert_eq!(d.requests.map(|q| q.remaining), Some(2));
        assert_eq!(d.tokens.map(|q| q.remaining), Some(70));
        assert!(second.take(&tenant, minute + 10_000).allowed);
        let third = first.take(&tenant, minute + 20_000);
        assert!(third.allowed);
        assert_eq!(third.requests.map(|q| (q.limit, q.remaining)), Some((3, 0)));
        let refused = second.take(&tenant, minute + 30_000);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_secs(30));
        assert_eq!(refused.requests.map(|q| q.remaining), Some(0));
        assert!(first.take(&tenant, minute + 60_000).allowed, "a new minute");
    }

    #[test]
    fn a_claim_without_room_counts_nothing_against_the_others() {
        let store: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
        let ledger = SharedRateLedger::new(store);
        let tenant = RateSubject::Tenant(Arc::from("a"));
        let key = RateSubject::Key([7; 32]);
        let both = |tokens| {
            [
                claim(tenant.clone(), Some(10), Some(1_000), tokens),
                claim(key.clone(), None, Some(300), tokens),
            ]
        };
        assert!(ledger.take(&both(200), 0).allowed);
        let refused = ledger.take(&both(200), 1);
        assert!(!refused.allowed);
        assert_eq!(refused.tokens.map(|q| q.remaining), Some(100), "the key's");
        assert_eq!(refused.requests.map(|q| q.remaining), Some(9));
        assert!(ledger.take(&both(100), 2).allowed);
    }
}
