//! The in-process ledger: counters behind one lock, forgotten on restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::{fits, Hold, HoldId, Ledger, LedgerError, Totals, UsageRecord, WindowId};

/// How many usage records the memory ledger keeps (the oldest go first).
pub const MEMORY_USAGE_RECORDS: usize = 100_000;

/// Counters in memory: exact for one process, lost when it exits.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    // One lock for every window: each operation is a few map lookups, and one lock
    // makes multi-window reservations all or nothing without a lock order.
    state: Mutex<State>,
}

/// Windows and holds in memory; the embedded ledger keeps its holds in one too.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) windows: HashMap<WindowId, Totals>,
    holds: HashMap<HoldId, Vec<(WindowId, f64)>>,
    usage: VecDeque<UsageRecord>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic mid-update of plain numbers; they are
        // still usable, and refusing every budgeted request would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    pub(super) fn totals(&self, window: &WindowId) -> Totals {
        self.windows.get(window).copied().unwrap_or_default()
    }

    /// Checks `holds` against the windows as if `id`'s current holds were returned.
    pub(super) fn check(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        let current = self.holds.get(&id);
        for (i, hold) in holds.iter().enumerate() {
            let mut totals = self.totals(&hold.window);
            if let Some(held) = current.and_then(|c| c.iter().find(|(w, _)| *w == hold.window)) {
                totals.reserved -= held.1;
            }
            fits(totals, hold.limit, hold.amount)
                .map_err(|remaining| LedgerError::Short { hold: i, remaining })?;
        }
        Ok(())
    }

    pub(super) fn drop_hold(&mut self, id: HoldId) {
        for (window, amount) in self.holds.remove(&id).unwrap_or_default() {
            let totals = self.windows.entry(window).or_default();
            totals.reserved = (totals.reserved - amount).max(0.0);
        }
    }

    pub(super) fn hold(&mut self, id: HoldId, holds: &[Hold]) {
        self.drop_hold(id);
        for hold in holds {
            self.windows
                .entry(hold.window.clone())
                .or_default()
                .reserved += hold.amount;
        }
        let held = holds.iter().map(|h| (h.window.clone(), h.amount)).collect();
        self.holds.insert(id, held);
    }
}

impl Ledger for MemoryLedger {
    fn reserve(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        let mut state = self.lock();
        state.check(id, holds)?;
        state.hold(id, holds);
        Ok(())
    }

    fn resize(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        self.reserve(id, holds)
    }

    fn settle(
        &self,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&UsageRecord>,
    ) -> Result<(), LedgerError> {
        let mut state = self.lock();
        state.drop_hold(id);
        for (window, amount) in spent {
            state.windows.entry(window.clone()).or_default().settled += amount;
        }
        if let Some(record) = usage {
            if state.usage.len() >= MEMORY_USAGE_RECORDS {
                state.usage.pop_front();
            }
            state.usage.push_back(record.clone());
        }
        Ok(())
    }

    fn release(&self, id: HoldId) -> Result<(), LedgerError> {
        self.lock().drop_hold(id);
        Ok(())
    }

    fn totals(&self, window: &WindowId) -> Result<Totals, LedgerError> {
        Ok(self.lock().totals(window))
    }

    fn usage_since(&self, since_ms: u64, limit: usize) -> Result<Vec<UsageRecord>, LedgerError> {
        Ok(self
            .lock()
            .usage
            .iter()
            .filter(|r| r.time_ms >= since_ms)
            .take(limit)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_ledger_keeps_the_contract() {
        super::super::contract::check(&MemoryLedger::new());
    }
}
