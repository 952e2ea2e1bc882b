//! Which rate ledger a server counts in, chosen from its spend ledger.

use std::sync::Arc;

use super::local::LocalRateLedger;
use super::shared::SharedRateLedger;
use super::RateLedger;
use crate::ledger::Ledger;

/// Where a server counts rate limits: in `ledger` when instances share it
/// ([`crate::ledger::Ledger::is_shared`]: Redis), else in this process.
pub fn rate_ledger_for(ledger: &Arc<dyn Ledger>) -> Arc<dyn RateLedger> {
    if ledger.is_shared() {
        Arc::new(SharedRateLedger::new(Arc::clone(ledger)))
    } else {
        Arc::new(LocalRateLedger::default())
    }
}
