//! A canary whose error rate rises is rolled back automatically, observably, and the
//! rollback survives a reload that leaves the split unchanged.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{example, request};
use switchyard_policies::{
    route, Completion, IdleEngine, Policy, PolicyStore, RollbackState, RouteReason, Usage,
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
