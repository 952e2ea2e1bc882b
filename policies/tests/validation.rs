//! Whole-file validation: every problem, with its line and column.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{assert_diag_at, diagnostics, pos_of};
use switchyard_policies::{Policy, PolicyError};

const MODEL: &str = r#"
[[models]]
name = "m"
version = "v1"
cost_per_1k_input = 0.1
cost_per_1k_output = 0.2
quality = 0.5
context_limit = 100
"#;

#[test]
fn syntax_errors_point_at_the_line() {
    let src = "[[models]]\nname = \"m\"\nversion = \n";
    let d = diagnostics(src);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].line, 3, "{d:?}");
}

#[test]
fn unknown_fields_are_rejected_where_they_are() {
    let src = format!("{MODEL}qualty = 0.3\n");
    let d = diagnostics(&src);
    assert_eq!(d[0].line, pos_of(&src, "qualty").0, "{d:?}");
    assert!(d[0].message.contains("qualty"), "{d:?}");
}

#[test]
fn negative_costs_and_out_of_range_quality() {
    let src = MODEL
        .replace("0.1", "-0.1")
        .replace("quality = 0.5", "quality = 1.5");
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "-0.1", "cost_per_1k_input");
    assert_diag_at(&d, &src, "1.5", "quality");
    assert_eq!(d.len(), 2, "every problem is reported at once: {d:?}");
}

#[test]
fn duplicate_names_and_aliases() {
    let src = format!(
        "{MODEL}aliases = [\"x\"]\n{}",
        MODEL.replace("name = \"m\"", "name = \"x\"")
    );
    let d = diagnostics(&src);
    let second = src.rfind("\"x\"").unwrap();
    let line = src[..second].matches('\n').count() + 1;
    assert!(
        d.iter()
            .any(|d| d.line == line && d.message.contains("already")),
        "{d:?}"
    );
}

#[test]
fn unknown_model_references_everywhere() {
    let src = format!(
        r#"{MODEL}
[[tenants]]
name = "t"
allowed_models = ["ghost"]

[[splits]]
name = "s"
model = "m"
arms = [
  {{ name = "a", target = "m@v1", weight = 50 }},
  {{ name = "b", target = "m@v9", weight = 50 }},
]

[[fallbacks]]
model = "m"
alternatives = ["phantom"]
"#
    );
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "\"ghost\"", "unknown model `ghost`");
    assert_diag_at(&d, &src, "\"m@v9\"", "no version `v9`");
    assert_diag_at(&d, &src, "\"phantom\"", "unknown model `phantom`");
}

#[test]
fn weights_must_sum_to_one_hundred() {
    let src = format!(
        r#"{MODEL}
[[splits]]
name = "s"
model = "m"
arms = [{{ name = "a", target = "m", weight = 90 }}, {{ name = "b", target = "m@v1", weight = 20 }}]
"#
    );
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "[{", "sum to 110");
}

#[test]
fn plaintext_keys_are_refused_and_env_keys_must_exist() {
    let src = format!(
        r#"{MODEL}
[[tenants]]
name = "t"
api_keys = ["sk-live-123", "env:NOT_SET", "sha256:abc"]
"#
    );
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "\"sk-live-123\"", "plain text");
    assert_diag_at(&d, &src, "\"env:NOT_SET\"", "NOT_SET");
    assert_diag_at(&d, &src, "\"sha256:abc\"", "64 hex digits");
}

#[test]
fn budgets_need_one_limit_and_a_valid_window() {
    let src = format!(
        r#"{MODEL}
[[tenants]]
name = "t"

[[tenants.budgets]]
window = "1 fortnight"
limit_tokens = 10

[[tenants.budgets]]
window = "1h"
limit_tokens = 10
limit_cost = 1.0
"#
    );
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "\"1 fortnight\"", "not a window");
    assert!(
        d.iter().any(|d| d.message.contains("exactly one of")),
        "{d:?}"
    );
}

#[test]
fn rollback_rule_names_real_arms() {
    let src = format!(
        r#"{MODEL}
[[splits]]
name = "s"
model = "m"
arms = [{{ name = "a", target = "m", weight = 50 }}, {{ name = "b", target = "m", weight = 50 }}]
[splits.rollback]
baseline = "a"
candidate = "c"
window = "5m"
min_samples = 0
max_error_rate_increase = 0.1
"#
    );
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "\"c\"", "not one of: a, b");
    assert!(d.iter().any(|d| d.message.contains("min_samples")), "{d:?}");
}

#[test]
fn quality_rollback_fields_are_checked_where_they_are() {
    let split = |rule: &str| {
        format!(
            r#"{MODEL}
[[splits]]
name = "s"
model = "m"
arms = [{{ name = "a", target = "m", weight = 50 }}, {{ name = "b", target = "m", weight = 50 }}]
[splits.rollback]
baseline = "a"
candidate = "b"
window = "5m"
min_samples = 3
{rule}
"#
        )
    };
    let src = split("max_feedback_drop = 1.5\nmax_confidence_drop = -0.2\neval_suite = \"geo\"");
    let d = diagnostics(&src);
    assert_diag_at(&d, &src, "1.5", "max_feedback_drop");
    assert_diag_at(&d, &src, "-0.2", "max_confidence_drop");
    assert_diag_at(&d, &src, "\"geo\"", "eval_suite needs max_eval_drop");
    let src = split("max_eval_drop = 0.02");
    assert_diag_at(
        &diagnostics(&src),
        &src,
        "0.02",
        "max_eval_drop needs eval_suite",
    );
    let src = split("");
    assert!(
        diagnostics(&src)
            .iter()
            .any(|d| d.message.contains("needs at least one of")),
        "{src}"
    );
    let policy = Policy::from_toml_str(&split(
        "max_confidence_drop = 0.3\nmax_feedback_drop = 0.2\neval_suite = \"geo\"\nmax_eval_drop = 0.02",
    ))
    .unwrap();
    let rule = policy.splits()[0].rollback().unwrap();
    assert_eq!(rule.max_confidence_drop, Some(0.3));
    assert_eq!(rule.max_feedback_drop, Some(0.2));
    assert_eq!(
        rule.eval.as_ref().map(|e| (e.suite.as_str(), e.max_drop)),
        Some(("geo", 0.02))
    );
}

#[test]
fn errors_render_as_path_line_column() {
    let src = MODEL.replace("0.2", "-1.0");
    let err = Policy::from_toml_str_with_env(&src, "p.toml", &|_| None).unwrap_err();
    let (line, col) = pos_of(&src, "-1.0");
    assert_eq!(err.first_location(), Some((line, col)));
    assert!(
        err.to_string().contains(&format!("p.toml:{line}:{col}: ")),
        "{err}"
    );
    assert!(matches!(err, PolicyError::Invalid { .. }));
}

#[test]
fn a_model_needs_a_version_and_reserved_names_are_refused() {
    let src = MODEL
        .replace("version = \"v1\"\n", "")
        .replace("name = \"m\"", "name = \"auto\"");
    let d = diagnostics(&src);
    assert!(d.iter().any(|d| d.message.contains("reserved")), "{d:?}");
    assert!(d.iter().any(|d| d.message.contains("no version")), "{d:?}");
}

#[test]
fn a_tenant_takes_one_budget_per_unit_and_window() {
    let src = format!(
        r#"{MODEL}
[[tenants]]
name = "t"
[[tenants.budgets]]
window = "1h"
limit_tokens = 10
[[tenants.budgets]]
window = "60m"
limit_tokens = 20
"#
    );
    let d = diagnostics(&src);
    assert!(
        d.iter()
            .any(|d| d.message.contains("two budgets of tokens per 3600s")),
        "{d:?}"
    );
}

#[test]
fn a_cascade_handoff_needs_the_min_margin_stop() {
    let two = format!("{MODEL}{}", MODEL.replace("name = \"m\"", "name = \"n\""));
    let cascade = |confidence: &str| {
        format!(
            "{two}\n[cascade]\nmodels = [\"m\", \"n\"]\nconfidence = \"{confidence}\"\nmin_confidence = {}\nhandoff = true\n",
            if confidence == "min_margin" { "0.5" } else { "-1.0" }
        )
    };
    let src = cascade("p10");
    let d = diagnostics(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].message
            .contains("handoff needs confidence = \"min_margin\""),
        "{d:?}"
    );
    assert_eq!(d[0].line, pos_of(&src, "handoff = true").0, "{d:?}");
    let policy = common::policy(&cascade("min_margin"));
    let compiled = policy.cascade().expect("the policy has a cascade");
    assert!(compiled.handoff && compiled.hands_off());
    let plain = common::policy(&cascade("min_margin").replace("handoff = true\n", ""));
    assert!(!plain
        .cascade()
        .expect("the policy has a cascade")
        .hands_off());
}
