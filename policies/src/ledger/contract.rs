//! What every store must do, as one test body each store's tests run.

use std::sync::Arc;

use super::{new_hold_id, Hold, Ledger, LedgerError, Totals, UsageRecord, WindowId};

fn window(key: &str, index: u64) -> WindowId {
    WindowId {
        key: Arc::from(key),
        index,
        ends_at: u64::MAX / 2,
    }
}

fn hold(window: &WindowId, limit: f64, amount: f64) -> Hold {
    Hold {
        window: window.clone(),
        limit,
        amount,
    }
}

fn record(time_ms: u64) -> UsageRecord {
    UsageRecord {
        time_ms,
        tenant: Some("t".into()),
        key_id: None,
        model: "m".into(),
        version: "v".into(),
        tokens_in: 1,
        tokens_out: 2,
        cost: 0.0,
        request_id: format!("r{time_ms}"),
    }
}

/// Reserve, refuse, resize, settle, release and usage records, on a fresh key space.
pub(crate) fn check(ledger: &dyn Ledger) {
    let suffix = new_hold_id();
    let a = window(&format!("contract:a:{suffix}"), 1);
    let b = window(&format!("contract:b:{suffix}"), 1);

    let first = new_hold_id();
    ledger
        .reserve(first, &[hold(&a, 100.0, 60.0), hold(&b, 1000.0, 60.0)])
        .expect("a reservation within both limits holds");
    // All or nothing: `b` has room, `a` does not, so neither is held.
    let second = new_hold_id();
    let refused = ledger.reserve(second, &[hold(&b, 1000.0, 50.0), hold(&a, 100.0, 50.0)]);
    assert_eq!(
        refused,
        Err(LedgerError::Short {
            hold: 1,
            remaining: 40.0
        })
    );
    assert_eq!(
        ledger
            .totals(&b)
            .expect("the ledger reads its totals")
            .reserved,
        60.0
    );

    // Growing past the limit is refused and leaves the hold; growing within it holds.
    assert!(ledger
        .resize(first, &[hold(&a, 100.0, 101.0), hold(&b, 1000.0, 1.0)])
        .is_err());
    assert_eq!(
        ledger
            .totals(&a)
            .expect("the ledger reads its totals")
            .reserved,
        60.0
    );
    ledger
        .resize(first, &[hold(&a, 100.0, 90.0), hold(&b, 1000.0, 90.0)])
        .expect("growing within the limit holds");
    assert_eq!(
        ledger
            .totals(&a)
            .expect("the ledger reads its totals")
            .reserved,
        90.0
    );

    ledger
        .settle(
            first,
            &[(a.clone(), 30.0), (b.clone(), 30.0)],
            Some(&record(10)),
        )
        .expect("settling a held reservation succeeds");
    assert_eq!(
        ledger.totals(&a).expect("the ledger reads its totals"),
        Totals {
            settled: 30.0,
            reserved: 0.0
        }
    );

    let third = new_hold_id();
    ledger
        .reserve(third, &[hold(&a, 100.0, 70.0)])
        .expect("a reservation within the limit holds");
    ledger
        .release(third)
        .expect("releasing a held reservation succeeds");
    assert_eq!(
        ledger
            .totals(&a)
            .expect("the ledger reads its totals")
            .reserved,
        0.0
    );
    // Another window index is another counter.
    assert_eq!(
        ledger
            .totals(&window(&a.key, 2))
            .expect("the ledger reads its totals"),
        Totals::default()
    );

    // Spend whose hold is gone still counts.
    ledger
        .settle(new_hold_id(), &[(a.clone(), 5.0)], Some(&record(20)))
        .expect("settling without a reservation succeeds");
    assert_eq!(
        ledger
            .totals(&a)
            .expect("the ledger reads its totals")
            .settled,
        35.0
    );

    let since: Vec<String> = ledger
        .usage_since(10, 100)
        .expect("the ledger reads its usage records")
        .into_iter()
        .filter(|r| r.request_id == "r10" || r.request_id == "r20")
        .map(|r| r.request_id)
        .collect();
    assert_eq!(since, ["r10", "r20"]);
    assert!(ledger
        .usage_since(15, 100)
        .expect("the ledger reads its usage records")
        .iter()
        .all(|r| r.time_ms >= 15));
}
