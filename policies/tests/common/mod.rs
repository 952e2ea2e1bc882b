//! Helpers shared by the integration tests.
#![allow(dead_code)]

use switchyard_policies::{Caller, Diagnostic, ModelHint, Policy, PolicyError, RouteRequest};

/// Loads a policy from a string with a fixed fake environment.
pub fn policy(src: &str) -> Policy {
    Policy::from_toml_str_with_env(src, "test.toml", &fake_env).unwrap()
}

/// Loads a policy expecting failure; returns its diagnostics.
pub fn diagnostics(src: &str) -> Vec<Diagnostic> {
    match Policy::from_toml_str_with_env(src, "test.toml", &fake_env) {
        Ok(_) => panic!("policy unexpectedly valid:\n{src}"),
        Err(PolicyError::Invalid { diagnostics, .. }) => diagnostics,
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

/// `SWITCHYARD_BATCH_KEY` and `TEST_KEY` are set; nothing else is.
pub fn fake_env(var: &str) -> Option<String> {
    match var {
        "SWITCHYARD_BATCH_KEY" => Some("sk-batch-demo".into()),
        "TEST_KEY" => Some("sk-test".into()),
        _ => None,
    }
}

/// 1-based (line, column) of the first occurrence of `needle` in `src`.
pub fn pos_of(src: &str, needle: &str) -> (usize, usize) {
    let offset = src
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in source"));
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    (line, col)
}

/// Asserts a diagnostic sits at `needle` and mentions `words`.
pub fn assert_diag_at(diags: &[Diagnostic], src: &str, needle: &str, words: &str) {
    let (line, column) = pos_of(src, needle);
    assert!(
        diags
            .iter()
            .any(|d| d.line == line && d.column == column && d.message.contains(words)),
        "no diagnostic at {line}:{column} mentioning `{words}`; got {diags:#?}"
    );
}

/// An anonymous request for `model`.
pub fn request(model: &str) -> RouteRequest {
    RouteRequest::new(ModelHint::parse(model), Caller::Anonymous)
}

/// A request for `model` with an API key.
pub fn keyed(model: &str, key: &str) -> RouteRequest {
    RouteRequest::new(ModelHint::parse(model), Caller::ApiKey(key.to_string()))
}

/// The examples directory at the workspace root.
pub fn example(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Two models: `cheap` (quality 0.4) and `good` (quality 0.9).
pub const TWO_MODELS: &str = r#"
[routing]
allow_anonymous = true
cost_weight = 100.0

[[models]]
name = "cheap"
version = "v1"
aliases = ["c"]
cost_per_1k_input = 0.001
cost_per_1k_output = 0.002
quality = 0.4
quality_by_tag = { code = 0.2 }
context_limit = 4096
latency_target_ms = 1000
max_queue_depth = 8

[[models]]
name = "good"
versions = ["v1", "v2"]
cost_per_1k_input = 0.01
cost_per_1k_output = 0.03
quality = 0.9
context_limit = 16384
"#;
