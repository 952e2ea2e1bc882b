//! The spend ledger: where budget windows keep what is reserved and what is spent, and
//! where every settled request is recorded for billing.
//!
//! A budget window ([`crate::BudgetWindow`]) holds only what the policy file says (its
//! limit, unit and length); its counters live in a [`Ledger`], one per server, shared by
//! every policy the server reloads to. Three stores implement it:
//!
//! - [`MemoryLedger`]: counters in the process, forgotten on restart (tests, `explain`,
//!   `--ledger memory`);
//! - [`EmbeddedLedger`]: a crash-safe file under the state directory (the default);
//! - [`RedisLedger`]: a Redis server shared by several instances, every reservation and
//!   settlement one server-side script.
//!
//! Every operation names its window by [`WindowId`] (a budget key and the window's
//! index), so the trait serves any counter with a limit per window: budgets today, and
//! request-rate limits kept the same way. A reservation is a [`HoldId`] holding amounts
//! on one or more windows, all or nothing; it ends settled (spend recorded) or released.
//!
//! What a crash leaves: a store's settled spend is durable when [`Ledger::settle`]
//! returns, and the router settles before the response carrying `usage` is sent, so a
//! `kill -9` loses no spend a client was told of. Holds of a dead process are released,
//! not counted (their requests never answered): the embedded store keeps holds in memory
//! only (one process owns the file), Redis expires them after the hold's time to live.

mod embedded;
mod memory;
mod redis_store;
mod usage;

use std::fmt;
use std::sync::Arc;

pub use embedded::EmbeddedLedger;
pub use memory::MemoryLedger;
pub use redis_store::{RedisLedger, RedisOptions};
pub use usage::UsageRecord;

/// One counter window: a budget (or other limited counter) and which of its windows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId {
    /// The counter's stable name, e.g. `budget:acme:tokens:3600`; the same across
    /// restarts, reloads and instances.
    pub key: Arc<str>,
    /// Which window (`unix seconds / window length`).
    pub index: u64,
    /// Unix seconds when the window ends (stores may forget it some time after).
    pub ends_at: u64,
}

impl WindowId {
    /// The key a store files this window under: `key#index`.
    pub fn storage_key(&self) -> String {
        format!("{}#{}", self.key, self.index)
    }
}

/// A reservation's identity, unique across instances (see [`new_hold_id`]).
pub type HoldId = u64;

/// An amount to hold on one window, if it fits under `limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// Where.
    pub window: WindowId,
    /// The window's limit now (the policy file owns limits; a reload changes them).
    pub limit: f64,
    /// How much.
    pub amount: f64,
}

/// A window's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Spend settled in the window.
    pub settled: f64,
    /// Held by reservations still running.
    pub reserved: f64,
}

/// Why a ledger operation did not happen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerError {
    /// Hold `hold` (an index into the holds asked for) does not fit its window.
    #[error("hold {hold} does not fit: {remaining} remaining")]
    Short {
        /// Which hold.
        hold: usize,
        /// What the window had left.
        remaining: f64,
    },
    /// The store could not be reached or written; nothing was changed.
    #[error("the {store} spend ledger is unavailable: {reason}")]
    Unavailable {
        /// `embedded` or `redis`.
        store: &'static str,
        /// What failed.
        reason: String,
    },
}

/// Where budget windows keep their counters and settled requests their usage records.
///
/// Every method is atomic: it happens whole or not at all, also across instances that
/// share a store. Limits are checked by the store, at the moment of the operation.
pub trait Ledger: Send + Sync + fmt::Debug {
    /// Holds each amount on its window, all or nothing: each must fit
    /// `settled + reserved + amount <= limit`, else [`LedgerError::Short`] names the
    /// first that does not.
    fn reserve(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError>;

    /// Changes what `id` holds to `holds` (the same windows): a larger amount must fit
    /// as in [`Ledger::reserve`]; on a refusal the hold stays as it was.
    fn resize(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError>;

    /// Ends `id`: each window's hold is returned and `spent` on it is settled, and
    /// `usage` (if any) is appended to the usage records, in one step that is durable
    /// when this returns. Spend is settled even when the hold is gone (expired).
    fn settle(
        &self,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&UsageRecord>,
    ) -> Result<(), LedgerError>;

    /// Ends `id` without spend.
    fn release(&self, id: HoldId) -> Result<(), LedgerError>;

    /// A window's counters now.
    fn totals(&self, window: &WindowId) -> Result<Totals, LedgerError>;

    /// At most `limit` usage records of requests settled at or after `since_ms` (Unix
    /// milliseconds), oldest first.
    fn usage_since(&self, since_ms: u64, limit: usize) -> Result<Vec<UsageRecord>, LedgerError>;

    /// Whether other instances share this store (then rate limits are counted in it
    /// too: [`crate::rate_ledger_for`]).
    fn is_shared(&self) -> bool {
        false
    }
}

/// A fresh hold id: a random 64-bit number (std's per-process hash keys mixed with a
/// counter and the clock), so that instances sharing a store do not collide.
pub fn new_hold_id() -> HoldId {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static STATE: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = STATE
        .get_or_init(std::collections::hash_map::RandomState::new)
        .build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// Unix milliseconds now (0 before 1970 rather than a panic).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `settled + reserved + amount <= limit`, with the remaining room when it does not.
/// A tiny tolerance keeps float sums of whole tokens from refusing an exact fit.
pub(crate) fn fits(totals: Totals, limit: f64, amount: f64) -> Result<(), f64> {
    let remaining = limit - totals.settled - totals.reserved;
    if amount <= remaining + 1e-9 {
        Ok(())
    } else {
        Err(remaining.max(0.0))
    }
}

#[cfg(test)]
pub(crate) mod contract;
