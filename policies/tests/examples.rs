//! The example policies in `examples/` load and route as their comments say.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{example, keyed, request};
use switchyard_policies::{
    route, CandidateState, IdleEngine, Policy, RouteErrorKind, RouteReason, StaticEngineView,
};

fn load(name: &str) -> Policy {
    Policy::from_toml_str_with_env(&example(name), name, &common::fake_env)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn cost_saver_picks_the_cheapest_good_enough_model() {
    let p = load("policy-cost-saver.toml");
    let mut req = request("auto");
    req.prompt_tokens = 300;
    for (floor, expected) in [
        ("0", "smollm2-135m"),
        ("0.45", "smollm2-360m"),
        ("0.6", "smollm2-1.7b"),
    ] {
        req.hints
            .apply_header("x-switchyard-min-quality", floor)
            .unwrap();
        assert_eq!(
            &*route(&p, &req, &IdleEngine).unwrap().model,
            expected,
            "floor {floor}"
        );
    }
    let mut busy = StaticEngineView::default();
    busy.checkpoints.insert(
        "smollm2-1.7b@q4_k_m".into(),
        CandidateState {
            queue_depth: 64,
            ..CandidateState::default()
        },
    );
    let r = route(&p, &request("best"), &busy).unwrap();
    assert_eq!(
        (&*r.model, r.reason),
        ("smollm2-360m", RouteReason::Fallback)
    );
}

#[test]
fn ab_rollout_splits_sticky_users_about_ninety_ten() {
    let p = load("policy-ab-rollout.toml");
    let mut canary = 0;
    for i in 0..4000 {
        let mut req = request("chat");
        req.user = Some(format!("user-{i}"));
        let r = route(&p, &req, &IdleEngine).unwrap();
        assert_eq!(r.reason, RouteReason::Split);
        let again = route(&p, &req, &IdleEngine).unwrap();
        assert_eq!(r.arm, again.arm, "sticky per user");
        if r.arm.as_deref() == Some("canary") {
            assert_eq!(&*r.version, "v2");
            canary += 1;
        }
    }
    assert!((320..=480).contains(&canary), "canary share {canary}/4000");
    let pinned = route(&p, &request("assistant@v2"), &IdleEngine).unwrap();
    assert_eq!((pinned.reason, pinned.arm), (RouteReason::Pinned, None));
}

#[test]
fn multi_tenant_keys_permissions_and_budgets() {
    let p = load("policy-multi-tenant.toml");
    let acme = route(&p, &keyed("auto", "sk-acme-demo"), &IdleEngine).unwrap();
    assert_eq!(acme.tenant.as_deref(), Some("acme"));
    assert_eq!(
        route(&p, &keyed("auto", "sk-acme-ci"), &IdleEngine)
            .unwrap()
            .tenant
            .as_deref(),
        Some("acme")
    );
    assert_eq!(
        route(&p, &keyed("auto", "sk-batch-demo"), &IdleEngine)
            .unwrap()
            .tenant
            .as_deref(),
        Some("batch")
    );
    let err = route(&p, &keyed("large", "sk-hobby-demo"), &IdleEngine).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::Unsatisfiable);
    assert!(
        err.to_string()
            .contains("tenant `hobby` may not use this model"),
        "{err}"
    );
    assert_eq!(
        route(&p, &request("auto"), &IdleEngine).unwrap_err().kind(),
        RouteErrorKind::Unauthenticated
    );

    // The hobby tier's 50,000 tokens per hour run out.
    let mut req = keyed("tiny", "sk-hobby-demo");
    req.prompt_tokens = 4000;
    req.max_output_tokens = Some(1000);
    let held: Vec<_> = (0..10)
        .map(|_| route(&p, &req, &IdleEngine).unwrap())
        .collect();
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::BudgetExhausted, "{err}");
    drop(held);
    assert!(
        route(&p, &req, &IdleEngine).is_ok(),
        "released reservations free the budget"
    );
}

#[test]
fn multi_tenant_needs_its_environment_key() {
    let err =
        Policy::from_toml_str_with_env(&example("policy-multi-tenant.toml"), "mt.toml", &|_| None)
            .unwrap_err();
    assert!(err.to_string().contains("SWITCHYARD_BATCH_KEY"), "{err}");
}
