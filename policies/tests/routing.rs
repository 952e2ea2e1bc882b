//! Routing decisions: hints, aliases, pins, constraints, fallbacks and errors.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{policy, request, TWO_MODELS};
use switchyard_policies::{
    explain, route, Caller, CandidateState, Completion, ConstraintFailure, IdleEngine, ModelHint,
    RouteError, RouteErrorKind, RouteReason, RouteRequest, StaticEngineView, Usage,
};

fn busy(checkpoint: &str, state: CandidateState) -> StaticEngineView {
    let mut v = StaticEngineView::default();
    v.checkpoints.insert(checkpoint.to_string(), state);
    v
}

#[test]
fn auto_without_hints_weighs_quality_against_cost() {
    let p = policy(TWO_MODELS);
    let mut req = request("auto");
    req.prompt_tokens = 100;
    req.max_output_tokens = Some(100);
    // good: 0.9 - 100 × (0.001 + 0.003) = 0.5; cheap: 0.4 - 100 × 0.0003 = 0.37.
    let r = route(&p, &req, &IdleEngine).unwrap();
    assert_eq!(
        (&*r.model, &*r.version, r.reason),
        ("good", "v2", RouteReason::Auto)
    );
    assert!(
        r.explanation
            .starts_with("auto: best utility 0.5000 of 2 qualifying"),
        "{}",
        r.explanation
    );
    // Long answers make `good` expensive enough that `cheap` wins.
    req.max_output_tokens = Some(2000);
    assert_eq!(&*route(&p, &req, &IdleEngine).unwrap().model, "cheap");
}

#[test]
fn hints_filter_candidates() {
    let p = policy(TWO_MODELS);
    let mut req = request("auto");
    req.prompt_tokens = 100;
    req.max_output_tokens = Some(2000);
    req.hints
        .apply_header("x-switchyard-min-quality", "0.5")
        .unwrap();
    assert_eq!(&*route(&p, &req, &IdleEngine).unwrap().model, "good");

    req.hints
        .apply_header("x-switchyard-max-cost", "0.001")
        .unwrap();
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    let RouteError::NoCandidate { rejections, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(rejections.len(), 2);
    let cheap = rejections.iter().find(|r| r.model == "cheap").unwrap();
    assert!(matches!(
        cheap.failures[..],
        [
            ConstraintFailure::QualityBelowFloor { .. },
            ConstraintFailure::CostAboveCeiling { .. }
        ]
    ));
    assert_eq!(err.kind(), RouteErrorKind::Unsatisfiable);
    let msg = err.to_string();
    assert!(
        msg.contains("cheap@v1 (quality 0.400 is below the floor 0.500, estimated cost"),
        "{msg}"
    );
}

#[test]
fn tags_use_the_weakest_per_tag_quality() {
    let p = policy(TWO_MODELS);
    let mut req = request("c");
    req.hints.apply_header("x-switchyard-tags", "code").unwrap();
    req.hints
        .apply_header("x-switchyard-min-quality", "0.3")
        .unwrap();
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    assert!(
        err.to_string().contains("quality 0.200 for tag `code`"),
        "{err}"
    );
}

#[test]
fn names_aliases_and_pins() {
    let p = policy(TWO_MODELS);
    let r = route(&p, &request("c"), &IdleEngine).unwrap();
    assert_eq!((&*r.model, r.reason), ("cheap", RouteReason::Alias));
    let r = route(&p, &request("good"), &IdleEngine).unwrap();
    assert_eq!((&*r.version, r.reason), ("v2", RouteReason::Named));
    let r = route(&p, &request("good@v1"), &IdleEngine).unwrap();
    assert_eq!((&*r.version, r.reason), ("v1", RouteReason::Pinned));
    assert!(matches!(
        route(&p, &request("good@v7"), &IdleEngine),
        Err(RouteError::UnknownVersion { .. })
    ));
    let err = route(&p, &request("gpt-5"), &IdleEngine).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown model `gpt-5`; use `auto` or one of: cheap, good"
    );
}

#[test]
fn context_and_live_state_constraints() {
    let p = policy(TWO_MODELS);
    let mut req = request("cheap");
    req.prompt_tokens = 4000;
    req.max_output_tokens = Some(200);
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    assert!(
        err.to_string()
            .contains("4200 tokens, above the context limit 4096"),
        "{err}"
    );

    let slow = busy(
        "cheap@v1",
        CandidateState {
            resident: false,
            est_swap_or_load_ms: 1500.0,
            ..CandidateState::default()
        },
    );
    let err = route(&p, &request("cheap"), &slow).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::Unavailable);
    assert!(
        err.to_string()
            .contains("above the model's latency target of 1000.0 ms"),
        "{err}"
    );

    let full = busy(
        "cheap@v1",
        CandidateState {
            queue_depth: 8,
            ..CandidateState::default()
        },
    );
    assert!(route(&p, &request("cheap"), &full)
        .unwrap_err()
        .to_string()
        .contains("queue depth 8"));
}

#[test]
fn equal_utilities_break_ties_by_name_then_version() {
    let src = r#"
[routing]
allow_anonymous = true
[[models]]
name = "b"
version = "v1"
cost_per_1k_input = 0.0
cost_per_1k_output = 0.0
quality = 0.5
context_limit = 10
[[models]]
name = "a"
versions = ["v2", "v1"]
cost_per_1k_input = 0.0
cost_per_1k_output = 0.0
quality = 0.5
context_limit = 10
"#;
    let p = policy(src);
    for _ in 0..3 {
        let r = route(&p, &request("auto"), &IdleEngine).unwrap();
        assert_eq!((&*r.model, &*r.version), ("a", "v1"));
    }
}

const FALLBACK: &str = r#"
[routing]
allow_anonymous = true
[[models]]
name = "big"
version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.01
quality = 0.9
context_limit = 1000
max_queue_depth = 4
[[models]]
name = "mid"
version = "v1"
cost_per_1k_input = 0.001
cost_per_1k_output = 0.001
quality = 0.6
context_limit = 1000
[[models]]
name = "tiny"
version = "v1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0001
quality = 0.3
context_limit = 1000
[[fallbacks]]
model = "big"
on = ["overloaded", "failing"]
alternatives = ["mid", "tiny"]
"#;

#[test]
fn fallbacks_apply_in_order_when_overloaded_or_failing() {
    let p = policy(FALLBACK);
    let full = busy(
        "big@v1",
        CandidateState {
            queue_depth: 4,
            ..CandidateState::default()
        },
    );
    let r = route(&p, &request("big"), &full).unwrap();
    assert_eq!((&*r.model, r.reason), ("mid", RouteReason::Fallback));
    assert_eq!(r.explanation, "fallback #1 for `big`");

    let mut both = full.clone();
    both.checkpoints.insert(
        "mid@v1".into(),
        CandidateState {
            healthy: false,
            ..CandidateState::default()
        },
    );
    assert_eq!(&*route(&p, &request("big"), &both).unwrap().model, "tiny");

    let ex = explain(&p, &request("big"), &both);
    assert_eq!(ex.pick.as_ref().map(|p| p.model.as_str()), Some("tiny"));
    assert_eq!(ex.candidates.len(), 3);
    assert!(ex.candidates.iter().all(|c| c.considered));
}

#[test]
fn fallbacks_do_not_apply_to_other_constraints() {
    let p = policy(FALLBACK);
    let mut req = request("big");
    req.max_output_tokens = Some(5000);
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    let RouteError::NoCandidate { rejections, .. } = err else {
        panic!()
    };
    assert_eq!(rejections.len(), 1, "only big was a candidate");
    let ex = explain(&p, &req, &IdleEngine);
    assert!(ex.pick.is_none());
    assert!(ex.candidates.iter().skip(1).all(|c| !c.considered));
}

const TENANTS: &str = r#"
[[models]]
name = "a"
version = "v1"
cost_per_1k_input = 1.0
cost_per_1k_output = 1.0
quality = 0.5
context_limit = 100000
[[models]]
name = "b"
version = "v1"
cost_per_1k_input = 0.1
cost_per_1k_output = 0.1
quality = 0.4
context_limit = 100000
[[tenants]]
name = "t"
api_keys = ["env:TEST_KEY"]
allowed_models = ["a"]
default_hints = { min_quality = 0.45 }
[[tenants.budgets]]
window = "5200w"
limit_tokens = 1000
[[fallbacks]]
model = "a"
on = ["over_budget"]
alternatives = ["b"]
"#;

#[test]
fn tenants_authenticate_and_are_restricted() {
    let p = policy(TENANTS);
    assert_eq!(
        route(&p, &request("a"), &IdleEngine).unwrap_err(),
        RouteError::MissingApiKey
    );
    let wrong = RouteRequest::new(ModelHint::parse("a"), Caller::ApiKey("sk-nope".into()));
    assert_eq!(
        route(&p, &wrong, &IdleEngine).unwrap_err(),
        RouteError::UnknownApiKey
    );
    let mut ok = RouteRequest::new(ModelHint::parse("auto"), Caller::ApiKey("sk-test".into()));
    ok.max_output_tokens = Some(10);
    let r = route(&p, &ok, &IdleEngine).unwrap();
    assert_eq!((&*r.model, r.tenant.as_deref()), ("a", Some("t")));
    // b is both not permitted and below the tenant's default floor.
    ok.model = ModelHint::parse("b");
    let err = route(&p, &ok, &IdleEngine).unwrap_err();
    assert!(
        err.to_string()
            .contains("tenant `t` may not use this model"),
        "{err}"
    );
    assert!(err.to_string().contains("below the floor 0.450"), "{err}");
}

#[test]
fn budgets_are_reserved_settled_and_exhausted() {
    let p = policy(TENANTS);
    let mut req = RouteRequest::new(ModelHint::parse("a"), Caller::Tenant("t".into()));
    req.prompt_tokens = 100;
    req.max_output_tokens = Some(300);
    let first = route(&p, &req, &IdleEngine).unwrap();
    let second = route(&p, &req, &IdleEngine).unwrap();
    assert_eq!(first.reservation.estimate().tokens, 400);
    // 800 of 1000 reserved: a third request does not fit.
    let err = route(&p, &req, &IdleEngine).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::BudgetExhausted, "{err}");
    assert!(
        err.to_string()
            .contains("budget `tokens per 3144960000s` has 200.000000 left"),
        "{err}"
    );
    let spent = first.finish(Completion {
        usage: Usage {
            prompt_tokens: 100,
            cached_tokens: 0,
            completion_tokens: 50,
        },
        succeeded: true,
        latency_ms: 10.0,
    });
    assert_eq!(spent.tokens, 150);
    assert!((spent.cost - 0.15).abs() < 1e-12);
    drop(second); // released: nothing spent
    let snapshot = p.budgets("t").unwrap()[0].snapshot();
    assert_eq!(
        (snapshot.settled, snapshot.reserved, snapshot.remaining),
        (150.0, 0.0, 850.0)
    );
}

/// A split arm on another model's checkpoint: under `auto` that checkpoint is one
/// candidate, not two.
#[test]
fn auto_counts_a_checkpoint_shared_through_a_split_once() {
    let p = policy(
        r#"
[routing]
allow_anonymous = true

[[models]]
name = "a"
version = "v1"
cost_per_1k_input = 0.0
cost_per_1k_output = 0.0
quality = 0.5
context_limit = 1000

[[models]]
name = "b"
version = "v1"
cost_per_1k_input = 0.0
cost_per_1k_output = 0.0
quality = 0.9
context_limit = 1000

[[splits]]
name = "a-to-b"
model = "a"
arms = [{ name = "all", target = "b@v1", weight = 100 }, { name = "none", target = "a@v1", weight = 0 }]
"#,
    );
    let r = route(&p, &request("auto"), &IdleEngine).unwrap();
    // The first model leading to the checkpoint keeps it: `a`, through its split.
    assert_eq!((&*r.model, &*r.version), ("b", "v1"));
    assert_eq!(r.reason, RouteReason::Split);
    let e = explain(&p, &request("auto"), &IdleEngine);
    let roles: Vec<String> = e
        .candidates
        .iter()
        .map(|c| format!("{}@{} {}", c.model, c.version, c.role))
        .collect();
    assert_eq!(roles, ["b@v1 split a-to-b arm all"]);
}
