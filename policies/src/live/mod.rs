//! The live state a compiled policy feeds: what requests change while the policy stays
//! the same. Budget windows with their spend, the rollback monitors of splits, the
//! engine view's probes and the metric handles, each indexed as the compiled policy
//! indexes what it belongs to.

pub(crate) mod budget;
pub(crate) mod rollback;

use std::sync::Arc;

use crate::compiled::CompiledPolicy;
use crate::engine_view::ProbeCell;
use crate::ledger::Ledger;
use crate::metrics::{RouteCounters, TenantMeter};
use budget::BudgetWindow;
use rollback::RollbackMonitor;

/// Everything of a policy that changes as requests run.
#[derive(Debug)]
pub(crate) struct LiveState {
    /// By tenant index.
    pub tenants: Vec<TenantState>,
    /// By split index: the monitor of the split's rollback rule, if it has one.
    pub rollbacks: Vec<Option<Arc<RollbackMonitor>>>,
    /// By checkpoint slot: where the engine view keeps its probe.
    pub probes: Box<[ProbeCell]>,
    /// Handles of the routed-request counters.
    pub route_counters: RouteCounters,
    /// Where the budget windows keep their counters and settled requests their usage.
    pub ledger: Arc<dyn Ledger>,
}

/// A window per budget of `tenant`, in its order.
fn budget_windows(
    tenant: &crate::compiled::tenant::Tenant,
    ledger: &Arc<dyn Ledger>,
) -> Vec<Arc<BudgetWindow>> {
    tenant
        .budgets
        .iter()
        .map(|b| {
            Arc::new(BudgetWindow::new(
                Arc::clone(&tenant.name),
                b.unit(),
                b.window_secs(),
                b.limit(),
                Arc::clone(ledger),
            ))
        })
        .collect()
}

/// One tenant's spend.
#[derive(Debug)]
pub(crate) struct TenantState {
    /// Per budget of the tenant, in the same order: its current window.
    pub budgets: Vec<Arc<BudgetWindow>>,
    /// The tenant's spend counters.
    pub meter: Arc<TenantMeter>,
}

impl LiveState {
    /// Fresh state for `compiled`, its budgets counted in `ledger`: every rule watching.
    pub(crate) fn new(compiled: &CompiledPolicy, ledger: Arc<dyn Ledger>) -> Self {
        let tenants = compiled
            .tenants
            .iter()
            .map(|t| TenantState {
                budgets: budget_windows(t, &ledger),
                meter: Arc::new(TenantMeter::new(Arc::clone(&t.name))),
            })
            .collect();
        let rollbacks = compiled
            .splits
            .iter()
            .map(|s| {
                let rule = s.rollback()?;
                Some(Arc::new(RollbackMonitor::new(
                    Arc::clone(&s.name),
                    Arc::clone(&s.arms.get(rule.baseline)?.name),
                    Arc::clone(&s.arms.get(rule.candidate)?.name),
                    rule.clone(),
                )))
            })
            .collect();
        LiveState {
            tenants,
            rollbacks,
            probes: (0..compiled.checkpoint_count)
                .map(|_| ProbeCell::default())
                .collect(),
            route_counters: RouteCounters::new(
                compiled.checkpoint_count,
                compiled.splits.iter().map(|s| s.arms.len()),
            ),
            ledger,
        }
    }

    /// Counts every budget in `ledger` from now on (before the policy serves).
    pub(crate) fn use_ledger(&mut self, compiled: &CompiledPolicy, ledger: Arc<dyn Ledger>) {
        for (tenant, state) in compiled.tenants.iter().zip(&mut self.tenants) {
            state.budgets = budget_windows(tenant, &ledger);
        }
        self.ledger = ledger;
    }

    /// The rollback monitor of split `split` (an index), if the split has a rule.
    #[inline]
    pub(crate) fn rollback(&self, split: usize) -> Option<&Arc<RollbackMonitor>> {
        self.rollbacks.get(split)?.as_ref()
    }

    /// Whether split `split`'s rollback rule has pinned it to its baseline arm.
    #[inline]
    pub(crate) fn is_rolled_back(&self, split: usize) -> bool {
        self.rollback(split).is_some_and(|m| m.is_rolled_back())
    }
}
