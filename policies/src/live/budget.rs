//! Spend budgets: reserve the worst case before a request runs, settle the actual after.
//!
//! Each tenant budget is a [`BudgetWindow`]: a limit in tokens or currency over a fixed
//! window aligned to the Unix epoch (a `1h` window rolls over on the hour). Its counters
//! live in the server's [`Ledger`]: a reservation succeeds only if
//! `settled + reserved + amount <= limit`, checked and recorded by the ledger in one
//! atomic step, so concurrent requests (on one instance or, with a shared ledger, on
//! many) can never together reserve past the limit.
//!
//! A request is settled in the window it was reserved in, even when it ends after that
//! window rolled over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::ledger::{self, Hold as LedgerHold, HoldId, Ledger, LedgerError, UsageRecord, WindowId};
use crate::metrics::{self, TenantMeter};
use crate::spend::{BudgetUnit, Price, Spend, Usage};

/// One tenant budget: a limit per rolling window, counted in a ledger. Shared by `Arc`
/// so that in-flight reservations and a reloaded policy keep counting the same window.
#[derive(Debug)]
pub struct BudgetWindow {
    tenant: Arc<str>,
    unit: BudgetUnit,
    window_secs: u64,
    label: Arc<str>,
    /// The ledger's name for this budget: the same across restarts and instances.
    key: Arc<str>,
    /// The limit's bits (`f64`): a reload changes it while requests read it.
    limit: AtomicU64,
    ledger: Arc<dyn Ledger>,
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
    /// A window of `window_secs` seconds (at least 1) allowing `limit` per window,
    /// counted in `ledger`.
    pub fn new(
        tenant: Arc<str>,
        unit: BudgetUnit,
        window_secs: u64,
        limit: f64,
        ledger: Arc<dyn Ledger>,
    ) -> Self {
        let window_secs = window_secs.max(1);
        let unit_name = match unit {
            BudgetUnit::Tokens => "tokens",
            BudgetUnit::Cost => "cost",
        };
        BudgetWindow {
            label: unit.label(window_secs),
            // The tenant's length first, so no tenant name can fake another's key.
            key: format!("budget:{}:{tenant}:{unit_name}:{window_secs}", tenant.len()).into(),
            tenant,
            unit,
            window_secs,
            limit: AtomicU64::new(limit.to_bits()),
            ledger,
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

    fn limit(&self) -> f64 {
        f64::from_bits(self.limit.load(Ordering::Relaxed))
    }

    /// Replaces the limit (on reload); counters are kept.
    pub(crate) fn set_limit(&self, limit: f64) {
        self.limit.store(limit.to_bits(), Ordering::Relaxed);
    }

    /// The ledger window containing `now`.
    fn window_at(&self, now: u64) -> WindowId {
        let index = now / self.window_secs;
        WindowId {
            key: Arc::clone(&self.key),
            index,
            ends_at: index.saturating_add(1).saturating_mul(self.window_secs),
        }
    }

    /// The state now, for display (counters read as zero while the ledger is down).
    pub fn snapshot(&self) -> BudgetSnapshot {
        self.snapshot_at(now_secs())
    }

    pub(crate) fn snapshot_at(&self, now: u64) -> BudgetSnapshot {
        let totals = self.ledger.totals(&self.window_at(now)).unwrap_or_default();
        let limit = self.limit();
        BudgetSnapshot {
            tenant: self.tenant.to_string(),
            unit: self.unit,
            window_secs: self.window_secs,
            limit,
            settled: totals.settled,
            reserved: totals.reserved,
            remaining: (limit - totals.settled - totals.reserved).max(0.0),
        }
    }

    /// What may still be reserved in the window containing `now` (the whole limit while
    /// the ledger cannot say: the reservation itself is what refuses).
    pub(crate) fn remaining_at(&self, now: u64) -> f64 {
        let limit = self.limit();
        match self.ledger.totals(&self.window_at(now)) {
            Ok(t) => (limit - t.settled - t.reserved).max(0.0),
            Err(_) => limit,
        }
    }
}

/// Part of a reservation held on one window.
#[derive(Debug)]
struct Hold {
    window: Arc<BudgetWindow>,
    id: WindowId,
    amount: f64,
}

/// Why a reservation was not taken.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// A budget has no room.
    Short(Shortfall),
    /// The ledger could not be asked (fail closed).
    Unavailable(String),
}

/// Which budget refused a reservation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shortfall {
    pub window: Arc<str>,
    pub needed: f64,
    pub remaining: f64,
}

/// Who a settled request is billed to, for its usage record.
#[derive(Debug, Clone, Default)]
pub(crate) struct Billing {
    pub tenant: Option<Arc<str>>,
    pub model: Arc<str>,
    pub version: Arc<str>,
}

/// Estimated spend held on every budget of a tenant while a request runs.
///
/// Call [`Reservation::settle`] with the actual usage when the request ends. Dropping a
/// reservation without settling releases it and records no spend (the request never ran).
#[derive(Debug)]
pub struct Reservation {
    tenant: Option<Arc<TenantMeter>>,
    /// The policy's ledger (`None`: a dry run, nothing is recorded).
    ledger: Option<Arc<dyn Ledger>>,
    id: HoldId,
    holds: Vec<Hold>,
    price: Price,
    estimate: Spend,
    billing: Billing,
    /// The caller's key, for the usage record's key id (hashed only when settling).
    api_key: Option<String>,
    request_id: String,
    finished: bool,
}

impl Reservation {
    /// Holds `estimate` on every window, all or nothing.
    pub(crate) fn reserve(
        tenant: Option<Arc<TenantMeter>>,
        ledger: &Arc<dyn Ledger>,
        windows: &[Arc<BudgetWindow>],
        estimate: Spend,
        price: Price,
        now: u64,
    ) -> Result<Reservation, Refusal> {
        let holds: Vec<Hold> = windows
            .iter()
            .map(|window| Hold {
                window: Arc::clone(window),
                id: window.window_at(now),
                amount: estimate.in_unit(window.unit),
            })
            .collect();
        let id = ledger::new_hold_id();
        if !holds.is_empty() {
            ledger
                .reserve(id, &ledger_holds(&holds))
                .map_err(|e| refusal(&holds, e))?;
        }
        Ok(Reservation {
            tenant,
            ledger: Some(Arc::clone(ledger)),
            id,
            holds,
            price,
            estimate,
            billing: Billing::default(),
            api_key: None,
            request_id: String::new(),
            finished: false,
        })
    }

    /// A reservation that holds nothing (for explain's dry runs).
    pub(crate) fn dry_run() -> Reservation {
        Reservation {
            tenant: None,
            ledger: None,
            id: 0,
            holds: Vec::new(),
            price: Price::default(),
            estimate: Spend::default(),
            billing: Billing::default(),
            api_key: None,
            request_id: String::new(),
            finished: true,
        }
    }

    /// The estimate that is held.
    pub fn estimate(&self) -> Spend {
        self.estimate
    }

    pub(crate) fn set_billing(&mut self, billing: Billing) {
        self.billing = billing;
    }

    /// Names the request in its usage record: its `x-request-id` and the API key it
    /// came with (only a hash of the key is recorded).
    pub fn label(&mut self, request_id: &str, api_key: Option<&str>) {
        request_id.clone_into(&mut self.request_id);
        self.api_key = api_key.map(str::to_owned);
    }

    /// Holds `estimate` instead of what is held now (the prompt's real token count
    /// replacing the estimate), all or nothing; a refusal leaves the reservation as it
    /// was.
    pub(crate) fn resize(&mut self, estimate: Spend) -> Result<(), Refusal> {
        let Some(ledger) = &self.ledger else {
            return Ok(());
        };
        let previous: Vec<f64> = self.holds.iter().map(|h| h.amount).collect();
        for hold in &mut self.holds {
            hold.amount = estimate.in_unit(hold.window.unit);
        }
        let result = if self.holds.is_empty() {
            Ok(())
        } else {
            ledger.resize(self.id, &ledger_holds(&self.holds))
        };
        match result {
            Ok(()) => {
                self.estimate = estimate;
                Ok(())
            }
            Err(error) => {
                for (hold, amount) in self.holds.iter_mut().zip(previous) {
                    hold.amount = amount;
                }
                Err(refusal(&self.holds, error))
            }
        }
    }

    /// Records the actual usage against every budget and returns what was spent.
    pub fn settle(self, usage: Usage) -> Spend {
        self.settle_at(usage, ledger::now_ms())
    }

    pub(crate) fn settle_at(mut self, usage: Usage, now_ms: u64) -> Spend {
        let spend = self.price.spend(
            u64::from(usage.prompt_tokens),
            u64::from(usage.completion_tokens),
        );
        self.finished = true;
        if let Some(ledger) = &self.ledger {
            let spent: Vec<(WindowId, f64)> = self
                .holds
                .iter()
                .map(|h| (h.id.clone(), spend.in_unit(h.window.unit)))
                .collect();
            let record = UsageRecord {
                time_ms: now_ms,
                tenant: self.billing.tenant.as_deref().map(str::to_owned),
                key_id: self
                    .api_key
                    .as_deref()
                    .map(|key| crate::keys::sha256_hex(key).chars().take(12).collect()),
                model: self.billing.model.to_string(),
                version: self.billing.version.to_string(),
                tokens_in: u64::from(usage.prompt_tokens),
                tokens_out: u64::from(usage.completion_tokens),
                cost: spend.cost,
                request_id: std::mem::take(&mut self.request_id),
            };
            if let Err(error) = ledger.settle(self.id, &spent, Some(&record)) {
                // The request ran and was answered: the spend is logged so that it can
                // be billed by hand, and the ledger's metric counts the failure.
                tracing::error!(
                    %error,
                    tenant = ?record.tenant,
                    request_id = %record.request_id,
                    tokens = spend.tokens,
                    cost = spend.cost,
                    "could not record settled spend in the ledger"
                );
            }
        }
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
        if self.finished {
            return;
        }
        self.finished = true;
        if self.holds.is_empty() {
            return;
        }
        if let Some(ledger) = &self.ledger {
            if let Err(error) = ledger.release(self.id) {
                tracing::warn!(%error, "could not release a budget reservation; it expires on its own");
            }
        }
    }
}

fn ledger_holds(holds: &[Hold]) -> Vec<LedgerHold> {
    holds
        .iter()
        .map(|h| LedgerHold {
            window: h.id.clone(),
            limit: h.window.limit(),
            amount: h.amount,
        })
        .collect()
}

fn refusal(holds: &[Hold], error: LedgerError) -> Refusal {
    match error {
        LedgerError::Short { hold, remaining } => {
            let (window, needed) = holds.get(hold).map_or((Arc::from("budget"), 0.0), |h| {
                (Arc::clone(&h.window.label), h.amount)
            });
            Refusal::Short(Shortfall {
                window,
                needed,
                remaining,
            })
        }
        LedgerError::Unavailable { .. } => Refusal::Unavailable(error.to_string()),
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

    fn ledger() -> Arc<dyn Ledger> {
        Arc::new(crate::ledger::MemoryLedger::new())
    }

    fn window(limit: f64) -> Arc<BudgetWindow> {
        window_in(&ledger(), limit)
    }

    fn window_in(ledger: &Arc<dyn Ledger>, limit: f64) -> Arc<BudgetWindow> {
        Arc::new(BudgetWindow::new(
            "t".into(),
            BudgetUnit::Tokens,
            LONG,
            limit,
            Arc::clone(ledger),
        ))
    }

    fn reserve(ws: &[Arc<BudgetWindow>], n: u64, now: u64) -> Result<Reservation, Refusal> {
        let ledger = Arc::clone(&ws[0].ledger);
        Reservation::reserve(None, &ledger, ws, tokens(n), Price::default(), now)
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
        let a = reserve(&ws, 60, 0).unwrap();
        let Err(Refusal::Short(err)) = reserve(&ws, 60, 0) else {
            panic!("the second reservation does not fit")
        };
        assert_eq!(err.remaining, 40.0);
        a.release();
        assert_eq!(w.remaining_at(0), 100.0);
    }

    #[test]
    fn settle_records_actual_not_estimate() {
        let w = window(100.0);
        let ws = [Arc::clone(&w)];
        let r = reserve(&ws, 60, 0).unwrap();
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
    fn windows_roll_over_and_late_settles_count_where_reserved() {
        let w = Arc::new(BudgetWindow::new(
            "t".into(),
            BudgetUnit::Tokens,
            60,
            100.0,
            ledger(),
        ));
        let ws = [Arc::clone(&w)];
        let r = reserve(&ws, 100, 59).unwrap();
        assert_eq!(w.remaining_at(59), 0.0);
        assert_eq!(w.remaining_at(60), 100.0);
        r.settle_at(
            Usage {
                prompt_tokens: 50,
                cached_tokens: 0,
                completion_tokens: 50,
            },
            61_000,
        );
        assert_eq!(w.remaining_at(61), 100.0);
        assert_eq!(w.snapshot_at(59).settled, 100.0);
    }

    #[test]
    fn all_or_nothing_across_windows() {
        let ledger = ledger();
        let roomy = window_in(&ledger, 1000.0);
        let tight = Arc::new(BudgetWindow::new(
            "t".into(),
            BudgetUnit::Tokens,
            LONG / 2,
            10.0,
            Arc::clone(&ledger),
        ));
        let ws = [Arc::clone(&roomy), Arc::clone(&tight)];
        assert!(reserve(&ws, 50, 0).is_err());
        assert_eq!(roomy.remaining_at(0), 1000.0);
    }

    #[test]
    fn dropping_releases() {
        let w = window(10.0);
        let ws = [Arc::clone(&w)];
        drop(reserve(&ws, 10, 0).unwrap());
        assert_eq!(w.remaining_at(0), 10.0);
    }
}

#[cfg(test)]
mod resize_tests {
    use super::*;

    #[test]
    fn resize_grows_within_the_limit_and_refuses_past_it() {
        let ledger: Arc<dyn Ledger> = Arc::new(crate::ledger::MemoryLedger::new());
        let w = Arc::new(BudgetWindow::new(
            "t".into(),
            BudgetUnit::Tokens,
            1 << 40,
            100.0,
            Arc::clone(&ledger),
        ));
        let ws = [Arc::clone(&w)];
        let spend = |tokens| Spend { tokens, cost: 0.0 };
        let mut r =
            Reservation::reserve(None, &ledger, &ws, spend(30), Price::default(), 0).unwrap();
        r.resize(spend(80)).unwrap();
        assert_eq!(w.remaining_at(0), 20.0);
        assert!(matches!(r.resize(spend(101)), Err(Refusal::Short(_))));
        assert_eq!((w.remaining_at(0), r.estimate().tokens), (20.0, 80));
        drop(r);
        assert_eq!(w.remaining_at(0), 100.0);
    }
}
