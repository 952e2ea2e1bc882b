//! The docs name files that exist: every repository path that
//! `docs/ARCHITECTURE.md`, `docs/DESIGN.md` and `README.md` quote in
//! backticks (`engine/src/serving/choice.rs`, `router/src/openai/`) must be
//! in the tree, so a move or a rename that forgets the docs fails here.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::Path;

/// Top-level folders whose paths the docs quote. A backticked token that
/// starts elsewhere (a crate-relative `cpu/kv_pool.rs`, a placeholder
/// `REPO/<model>/`) is prose, not a path this test can check.
const ROOTS: &[&str] = &[
    ".ci/",
    "benches/",
    "deploy/",
    "docs/",
    "engine/",
    "examples/",
    "fuzz-targets/",
    "kernels/",
    "policies/",
    "router/",
    "scripts/",
    "seam/",
    "src/",
    "tests/",
    "tools/",
];

const DOCS: &[&str] = &["docs/ARCHITECTURE.md", "docs/DESIGN.md", "README.md"];

/// The repository paths quoted in `text`: backticked tokens under one of
/// [`ROOTS`], with a trailing `:item` (`layer.rs:read_body`) cut off.
fn quoted_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|token| {
            let path = token.split(':').next()?.trim();
            let plain = path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
            (plain && ROOTS.iter().any(|root| path.starts_with(root))).then(|| path.to_string())
        })
        .collect()
}

#[test]
fn every_path_the_docs_quote_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        for path in quoted_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{doc}: `{path}`"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "the docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn quoted_paths_takes_repository_paths_only() {
    let text = "see `engine/src/serving/choice.rs`, `policy/layer.rs:read_body`, \
                `router/src/policy/layer.rs:read_body`, `REPO/<model>/` and `--kv-block`";
    assert_eq!(
        quoted_paths(text),
        ["engine/src/serving/choice.rs", "router/src/policy/layer.rs"]
    );
}
