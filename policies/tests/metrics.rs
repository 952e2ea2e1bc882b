//! The routing counters count every request, through the handles a policy caches, under
//! each reason and split arm, and spend is counted per tenant.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::policy;
use metrics_exporter_prometheus::PrometheusBuilder;
use switchyard_policies::{
    route, Caller, Completion, IdleEngine, ModelHint, Route, RouteRequest, Usage,
};

const POLICY: &str = r#"
[routing]
allow_anonymous = true

[[models]]
name = "good"
versions = ["v1", "v2"]
cost_per_1k_input = 0.001
cost_per_1k_output = 0.003
quality = 0.9
context_limit = 4096

[[models]]
name = "cheap"
version = "v1"
aliases = ["budget"]
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.4
context_limit = 4096

[[splits]]
name = "rollout"
model = "good"
sticky = "user"
arms = [
  { name = "old", target = "good@v1", weight = 50 },
  { name = "new", target = "good@v2", weight = 50 },
]

[[tenants]]
name = "acme"
api_keys = ["env:TEST_KEY"]
allowed_models = ["*"]
[[tenants.budgets]]
window = "1h"
limit_tokens = 1000000
"#;

fn request(model: &str, caller: Caller, user: usize) -> RouteRequest {
    let mut r = RouteRequest::new(ModelHint::parse(model), caller);
    r.user = Some(format!("user-{user}"));
    r.prompt_tokens = 10;
    r.max_output_tokens = Some(10);
    r
}

/// The value of the sample line starting with `series` (labels as rendered).
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Settles `r` as a success of 7 prompt and 5 completion tokens.
fn finish_with_12_tokens(r: Route) {
    r.finish(Completion {
        usage: Usage {
            prompt_tokens: 7,
            cached_tokens: 0,
            completion_tokens: 5,
        },
        succeeded: true,
        latency_ms: 1.0,
    });
}

#[test]
fn routed_and_spend_counters_count_every_request() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let p = policy(POLICY);
    let (mut old, mut new) = (0, 0);
    metrics::with_local_recorder(&recorder, || {
        for user in 0..40 {
            let r = route(&p, &request("good", Caller::Anonymous, user), &IdleEngine).unwrap();
            match r.arm.as_deref() {
                Some("old") => old += 1,
                _ => new += 1,
            }
        }
        for _ in 0..3 {
            route(&p, &request("cheap", Caller::Anonymous, 0), &IdleEngine).unwrap();
            route(&p, &request("budget", Caller::Anonymous, 0), &IdleEngine).unwrap();
            route(&p, &request("cheap@v1", Caller::Anonymous, 0), &IdleEngine).unwrap();
        }
        for _ in 0..4 {
            let caller = Caller::ApiKey("sk-test".into());
            finish_with_12_tokens(route(&p, &request("cheap", caller, 0), &IdleEngine).unwrap());
        }
    });
    let text = handle.render();
    let routed = |model: &str, version: &str, arm: &str, reason: &str| {
        let series = format!(
            "switchyard_policy_routed_total{{model=\"{model}\",version=\"{version}\",arm=\"{arm}\",reason=\"{reason}\"}}"
        );
        sample(&text, &series)
    };
    assert!(old > 0 && new > 0, "40 users all on one arm: {old} / {new}");
    assert_eq!(routed("good", "v1", "old", "split"), old, "{text}");
    assert_eq!(routed("good", "v2", "new", "split"), new, "{text}");
    let arm = |name: &str| {
        sample(
            &text,
            &format!("switchyard_policy_split_arm_total{{split=\"rollout\",arm=\"{name}\"}}"),
        )
    };
    assert_eq!((arm("old"), arm("new")), (old, new), "{text}");
    assert_eq!(routed("cheap", "v1", "none", "named"), 3 + 4, "{text}");
    assert_eq!(routed("cheap", "v1", "none", "alias"), 3, "{text}");
    assert_eq!(routed("cheap", "v1", "none", "pinned"), 3, "{text}");
    let spent = sample(
        &text,
        "switchyard_policy_spend_tokens_total{tenant=\"acme\"}",
    );
    assert_eq!(spent, 4 * 12, "{text}");
}

#[test]
fn registering_shows_every_tenant_at_zero_and_later_spend_adds_to_it() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let p = policy(POLICY);
    let series = "switchyard_policy_spend_tokens_total{tenant=\"acme\"}";
    metrics::with_local_recorder(&recorder, || p.register_metrics());
    let text = handle.render();
    assert!(
        text.lines().any(|l| l.trim() == format!("{series} 0")),
        "{text}"
    );
    metrics::with_local_recorder(&recorder, || {
        let caller = Caller::ApiKey("sk-test".into());
        finish_with_12_tokens(route(&p, &request("cheap", caller, 0), &IdleEngine).unwrap());
    });
    assert_eq!(sample(&handle.render(), series), 12);
}
