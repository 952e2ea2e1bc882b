//! A canary whose error rate rises is rolled back automatically, observably, and the
//! rollback survives a reload that leaves the split unchanged; an operator's reset of a
//! rollback on stored evaluations survives the same records being read again.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{example, request};
use switchyard_policies::{
    route, Completion, IdleEngine, Measured, Measurement, Policy, PolicyStore, QualitySource,
    RollbackState, RouteReason, Usage,
};

fn finish(r: switchyard_policies::Route, succeeded: bool) {
    r.finish(Completion {
        usage: Usage {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 10,
        },
        succeeded,
        latency_ms: 100.0,
    });
}

#[test]
fn failing_canary_is_rolled_back_and_stays_rolled_back_across_reloads() {
    let src = example("policy-ab-rollout.toml");
    let store = PolicyStore::new(Policy::from_toml_str(&src).unwrap());
    let mut served = [0usize; 2];
    for i in 0..2000 {
        let mut req = request("assistant");
        req.user = Some(format!("u{i}"));
        let r = store.route(&req, &IdleEngine).unwrap();
        let canary = r.arm.as_deref() == Some("canary");
        served[usize::from(canary)] += 1;
        // The canary fails one request in four; the stable arm never does.
        finish(r, !(canary && i % 4 == 0));
    }
    assert!(
        served[1] >= 50,
        "enough canary traffic to judge: {served:?}"
    );
    let status = store.current().rollback_status();
    let s = status
        .iter()
        .find(|s| s.split == "assistant-v2-canary")
        .unwrap();
    assert!(matches!(s.state, RollbackState::RolledBack { .. }), "{s:?}");
    assert!(
        s.candidate.error_rate > 0.2 && s.baseline.error_rate == 0.0,
        "{s:?}"
    );

    // Every user now gets the stable arm, including former canary users.
    store
        .reload_from_str(&src.replace("quality = 0.8", "quality = 0.85"), "edited")
        .unwrap();
    for i in 0..500 {
        let mut req = request("chat");
        req.user = Some(format!("u{i}"));
        let r = store.route(&req, &IdleEngine).unwrap();
        assert_eq!(
            (r.arm.as_deref(), r.reason),
            (Some("stable"), RouteReason::RolledBack)
        );
        assert_eq!(&*r.version, "v1");
    }
    assert!(store.current().reset_rollback("assistant-v2-canary"));
    let policy = store.current();
    let canary_again = (0..500).any(|i| {
        let mut req = request("chat");
        req.user = Some(format!("u{i}"));
        route(&policy, &req, &IdleEngine).unwrap().arm.as_deref() == Some("canary")
    });
    assert!(canary_again, "reset returns to the weighted split");
}

#[test]
fn a_healthy_canary_keeps_its_share() {
    let store =
        PolicyStore::new(Policy::from_toml_str(&example("policy-ab-rollout.toml")).unwrap());
    for i in 0..3000 {
        let mut req = request("assistant");
        req.user = Some(format!("u{i}"));
        let r = store.route(&req, &IdleEngine).unwrap();
        finish(r, i % 50 != 0);
    }
    let status = store.current().rollback_status();
    assert!(
        status.iter().all(|s| s.state == RollbackState::Watching),
        "{status:?}"
    );
}

/// Stored accuracies by `model@version/suite`, as a model repository would hold them.
#[derive(Debug, Default)]
struct Records {
    acc: Mutex<HashMap<String, f64>>,
    stored: AtomicU64,
}

impl Records {
    fn store(&self, key: &str, acc: f64) {
        self.acc.lock().unwrap().insert(key.to_string(), acc);
        self.stored.fetch_add(1, Ordering::SeqCst);
    }
}

impl QualitySource for Records {
    fn measurement(&self, model: &str, version: &str, suite: &str) -> Measurement {
        match self
            .acc
            .lock()
            .unwrap()
            .get(&format!("{model}@{version}/{suite}"))
        {
            Some(&acc) => Measurement::Fresh {
                measured: Measured {
                    acc,
                    n: 200,
                    ci95: [acc - 0.05, acc + 0.05],
                },
            },
            None => Measurement::Missing {
                why: "never measured".into(),
            },
        }
    }

    fn fingerprint(&self) -> u64 {
        self.stored.load(Ordering::SeqCst)
    }
}

fn eval_state(store: &PolicyStore) -> RollbackState {
    store
        .current()
        .rollback_monitor("s")
        .unwrap()
        .status()
        .state
}

#[test]
fn a_reset_of_an_evaluation_rollback_outlasts_rereading_the_same_records() {
    let src = r#"
        [routing]
        allow_anonymous = true

        [[models]]
        name = "small"
        versions = ["1", "2"]
        active_version = "1"
        cost_per_1k_input = 0.0
        cost_per_1k_output = 0.0
        quality = 0.5
        context_limit = 100

        [[splits]]
        name = "s"
        model = "small"
        arms = [{ name = "old", target = "small@1", weight = 50 }, { name = "new", target = "small@2", weight = 50 }]

        [splits.rollback]
        baseline = "old"
        candidate = "new"
        window = "5m"
        min_samples = 1000
        eval_suite = "geo"
        max_eval_drop = 0.05
    "#;
    let records = Arc::new(Records::default());
    records.store("small@1/geo", 0.60);
    records.store("small@2/geo", 0.50);
    let store = PolicyStore::new(Policy::from_toml_str(src).unwrap());
    store.set_quality_source(records.clone()).unwrap();
    // Every reload reads the records again (the watcher reloads when one is stored).
    let reread = || store.reload_from_str(src, "reread").unwrap();
    reread();
    let RollbackState::RolledBack { signal, reason, .. } = eval_state(&store) else {
        panic!("not rolled back: {:?}", eval_state(&store));
    };
    assert_eq!(signal, "eval");
    assert!(reason.contains("0.500 (n 200) against 0.600"), "{reason}");

    assert!(store.current().reset_rollback("s"));
    // The same figures read again, and the baseline stored again unchanged: still reset.
    reread();
    records.store("small@1/geo", 0.60);
    reread();
    assert_eq!(eval_state(&store), RollbackState::Watching);
    let policy = store.current();
    let arms: std::collections::HashSet<_> = (0..200)
        .map(|i| {
            let mut req = request("small");
            req.user = Some(format!("u{i}"));
            route(&policy, &req, &IdleEngine)
                .unwrap()
                .arm
                .as_deref()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(arms.len(), 2, "the split's weights apply again: {arms:?}");

    // New evidence, the candidate measured lower again, trips the rule again.
    records.store("small@2/geo", 0.45);
    reread();
    let RollbackState::RolledBack { reason, .. } = eval_state(&store) else {
        panic!("new evidence did not trip the rule");
    };
    assert!(reason.contains("0.450 (n 200) against 0.600"), "{reason}");
}
