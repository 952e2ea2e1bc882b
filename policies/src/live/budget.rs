//! Spend budgets: reserve the estimated spend before a request runs, settle the actual after.
//!
//! Each tenant budget is a [`BudgetWindow`]: a limit in tokens or currency over a fixed
//! window aligned to the Unix epoch (a `1h` window rolls over on the hour). A reservation
//! succeeds only if `settled + reserved + amount <= limit`, checked and recorded under the
//! window's lock, so concurrent requests can never together reserve past the limit.
//!
//! A request that straddles a rollover is counted against the window it was reserved in;
//! that window is gone by the time it settles, so its late spend is not carried over.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::metrics::{self, TenantMeter};
use crate::spend::{BudgetUnit, Price, Spend, Usage};

/// One tenant budget: a limit per rolling window. Shared by `Arc` so that in-flight
/// reservations and a reloaded policy keep counting against the same window.
#[derive(Debug)]
pub struct BudgetWindow {
    tenant: Arc<str>,
    unit: BudgetUnit,
    window_secs: u64,
    label: Arc<str>,
    // One lock per window; never held together with another window's lock.
    state: Mutex<WindowState>,
}

#[derive(Debug)]
struct WindowState {
    limit: f64,
    /// Which window (`now / window_secs`) the counters belong to.
    index: u64,
    settled: f64,
    reserved: f64,
}

/// A point-in-time view of a budget window, for explain and admin output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetSnapshot {
    /// Tenant the budget belongs to.
    pub tenant: String,
    /// Tokens or cost.
    pub unit: BudgetUnit,
    /// Window length in seconds.
    pub window_secs: u64,
    /// Limit per window.
    pub limit: f64,
    /// Spend settled in the current window.
    pub settled: f64,
    /// Spend reserved by requests still running.
    pub reserved: f64,
    /// `limit - settled - reserved`, never below zero.
    pub remaining: f64,
}

/// Seconds since the Unix epoch; a clock before 1970 counts as 0 rather than panicking.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl BudgetWindow {
    /// A window of `window_secs` seconds (at least 1) allowing `limit` per window.
    pub fn new(tenant: Arc<str>, unit: BudgetUnit, window_secs: u64, limit: f64) -> Self {
        let window_secs = window_secs.max(1);
        BudgetWindow {
            label: unit.label(window_secs),
            tenant,
            unit,
            window_secs,
            state: Mutex::new(WindowState {
                limit,
                index: 0,
                settled: 0.0,
                reserved: 0.0,
            }),
        }
    }

    /// Tokens or cost.
    pub fn unit(&self) -> BudgetUnit {
        self.unit
    }

    /// Window length in seconds.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }

    /// A short label such as `tokens per 3600s`.
    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    /// Replaces the limit (on reload); counters are kept.
    pub(crate) fn set_limit(&self, limit: f64) {
        self.lock_at(now_secs()).limit = limit;
    }

    /// The state now, for display.
    pub fn snapshot(&self) -> BudgetSnapshot {
        self.snapshot_at(now_secs())
    }

    pub(crate) fn snapshot_at(&self, now: u64) -> BudgetSnapshot {
        let s = self.lock_at(now);
        BudgetSnapshot {
            tenant: self.tenant.to_string(),
            unit: self.unit,
            window_secs: self.window_secs,
            limit: s.limit,
            settled: s.settled,
            reserved: s.reserved,
            remaining: (s.limit - s.settled - s.reserved).max(0.0),
        }
    }

    /// What may still be reserved in the window containing `now`.
    pub(crate) fn remaining_at(&self, now: u64) -> f64 {
        let s = self.lock_at(now);
        (s.limit - s.settled - s.reserved).max(0.0)
    }

    /// Locks the state, first rolling it over if `now` lies in a later window.
    fn lock_at(&self, now: u64) -> MutexGuard<'_, WindowState> {
        // A poisoned lock only means another thread panicked mid-update of plain numbers;
        // the numbers are still usable, and refusing all routing would be worse.
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let index = now / self.window_secs;
        if index > s.index {
            s.index = index;
            s.settled = 0.0;
            s.reserved = 0.0;
        }
        s
    }

    fn try_hold(self: &Arc<Self>, amount: f64, now: u64) -> Result<Hold, f64> {
        let mut s = self.lock_at(now);
        let remaining = s.limit - s.settled - s.reserved;
        if amount > remaining {
            return Err(remaining.max(0.0));
        }
        s.reserved += amount;
        Ok(Hold {
            window: Arc::clone(self),
            amount,
            index: s.index,
        })
    }
}

/// Part of a reservation held on one window.
#[derive(Debug)]
struct Hold {
    window: Arc<BudgetWindow>,
    amount: f64,
    index: u64,
}

impl Hold {
    /// Returns the held amount and, when `actual` is given, records it as spent.
    fn finish(&self, actual: Option<f64>, now: u64) {
        let mut s = self.window.lock_at(now);
        if s.index != self.index {
            return; // The window rolled over; its counters were reset already.
        }
        s.reserved = (s.reserved - self.amount).max(0.0);
        if let Some(actual) = actual {
            s.settled += actual;
        }
    }
}

/// Which budget refused a reservation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shortfall {
    pub window: Arc<str>,
    pub needed: f64,
    pub remaining: f64,
}

/// Estimated spend held on every budget of a tenant while a request runs.
///
/// Call [`Reservation::settle`] with the actual usage when the request ends. Dropping a
/// reservation without settling releases it and records no spend (the request never ran).
#[derive(Debug)]
pub struct Reservation {
    tenant: Option<Arc<TenantMeter>>,
    holds: Vec<Hold>,
    price: Price,
    estimate: Spend,
    finished: bool,
}

impl Reservation {
    /// Holds `estimate` on every window, all or nothing.
    pub(crate) fn reserve(
        tenant: Option<Arc<TenantMeter>>,
        windows: &[Arc<BudgetWindow>],
        estimate: Spend,
        price: Price,
        now: u64,
    ) -> Result<Reservation, Shortfall> {
        let mut reservation = Reservation {
            tenant,
            holds: Vec::with_capacity(windows.len()),
            price,
            estimate,
            finished: false,
        };
        for window in windows {
            let amount = estimate.in_unit(window.unit);
            match window.try_hold(amount, now) {
                Ok(hold) => reservation.holds.push(hold),
                // Dropping `reservation` here releases the holds taken so far.
                Err(remaining) => {
                    return Err(Shortfall {
                        window: Arc::clone(&window.label),
                        needed: amount,
                        remaining,
                    })
                }
            }
        }
        Ok(reservation)
    }

    /// A reservation that holds nothing (for explain's dry runs).
    pub(crate) fn dry_run() -> Reservation {
        Reservation {
            tenant: None,
            holds: Vec::new(),
            price: Price::default(),
            estimate: Spend::default(),
            finished: true,
        }
    }

    /// The estimate that is held.
    pub fn estimate(&self) -> Spend {
        self.estimate
    }

    /// Records the actual usage against every budget and returns what was spent.
    pub fn settle(self, usage: Usage) -> Spend {
        self.settle_at(usage, now_secs())
    }

    pub(crate) fn settle_at(mut self, usage: Usage, now: u64) -> Spend {
        let spend = self.price.spend(
            u64::from(usage.prompt_tokens),
            u64::from(usage.completion_tokens),
        );
        for hold in &self.holds {
            let actual = spend.in_unit(hold.window.unit);
            hold.finish(Some(actual), now);
        }
        self.finished = true;
        if let Some(tenant) = &self.tenant {
            metrics::spend(tenant, spend);
        }
        spend
    }

    /// Gives the held amount back without recording spend.
    pub fn release(mut self) {
        self.release_now();
    }

    fn release_now(&mut self) {
        if !self.finished {
            let now = now_secs();
            for hold in &self.holds {
                hold.finish(None, now);
            }
            self.finished = true;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A window far longer than a test run, so release-on-drop (which reads the real
    // clock) lands in the same window as the reservation.
    const LONG: u64 = 1 << 40;

    fn window(limit: f64) -> Arc<BudgetWindow> {
        Arc::new(BudgetWindow::new(
            "t".into(),
            BudgetUnit::Tokens,
            LONG,
            limit,
        ))
    }

    fn tokens(n: u64) -> Spend {
        Spend {
            tokens: n,
            cost: 0.0,
        }
    }

    #[test]
    fn reserve_refuses_past_the_limit_and_release_gives_back() {
        let w = window(100.0);
        let ws = [Arc::clone(&w)];
        let a = Reservation::reserve(None, &ws, tokens(60), Price::default(), 0).unwrap();
        let err = Reservation::reserve(None, &ws, tokens(60), Price::default(), 0).unwrap_err();
        assert_eq!(err.remaining, 40.0);
        a.release();
        assert_eq!(w.remaining_at(0), 100.0);
    }

    #[test]
    fn settle_records_actual_not_estimate() {
        let w = window(100.0);
        let ws = [Arc::clone(&w)];
        let r = Reservation::reserve(None, &ws, tokens(60), Price::default(), 0).unwrap();
        let spent = r.settle_at(
            Usage {
                prompt_tokens: 10,
                cached_tokens: 0,
                completion_tokens: 5,
            },
            0,
        );
        assert_eq!(spent.tokens, 15);
        assert_eq!(w.remaining_at(0), 85.0);
    }

    #[test]
    fn windows_roll_over_and_late_settles_are_dropped() {
        let w = Arc::new(BudgetWindow::new("t".into(), BudgetUnit::Tokens, 60, 100.0));
        let ws = [Arc::clone(&w)];
        let r = Reservation::reserve(None, &ws, tokens(100), Price::default(), 59).unwrap();
        assert_eq!(w.remaining_at(59), 0.0);
        assert_eq!(w.remaining_at(60), 100.0);
        r.settle_at(
            Usage {
                prompt_tokens: 50,
                cached_tokens: 0,
                completion_tokens: 50,
            },
            61,
        );
        assert_eq!(w.remaining_at(61), 100.0);
    }

    #[test]
    fn all_or_nothing_across_windows() {
        let roomy = window(1000.0);
        let tight = window(10.0);
        let ws = [Arc::clone(&roomy), Arc::clone(&tight)];
        assert!(Reservation::reserve(None, &ws, tokens(50), Price::default(), 0).is_err());
        assert_eq!(roomy.remaining_at(0), 1000.0);
    }

    #[test]
    fn dropping_releases() {
        let w = window(10.0);
        let ws = [Arc::clone(&w)];
        drop(Reservation::reserve(None, &ws, tokens(10), Price::default(), 0).unwrap());
        assert_eq!(w.remaining_at(0), 10.0);
    }
}
