//! The docs name files that exist: every repository path that `README.md`,
//! `BENCHMARKS.md`, `RELIABILITY.md` or a Markdown file under `docs/` quotes in
//! backticks (`engine/src/serving/choice.rs`, `router/src/openai/`) must be in
//! the tree, and every relative link of theirs (`[x](docs/bench/serving.md)`,
//! a plot `![x](../long_context.svg)`) must reach a file, so a move or a rename
//! that forgets the docs fails here. And they say what is true without
//! sending the reader to an issue tracker: no "issue N" outside the diary
//! (`docs/journal/`).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

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

/// The documents at the top of the repository; every `.md` under `docs/` is
/// read too.
const TOP_DOCS: &[&str] = &["README.md", "BENCHMARKS.md", "RELIABILITY.md"];

/// Every document checked, as paths relative to the repository root.
fn docs(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = TOP_DOCS.iter().map(PathBuf::from).collect();
    let mut folders = vec![PathBuf::from("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(root.join(&folder)).unwrap() {
            let path = folder.join(entry.unwrap().file_name());
            if root.join(&path).is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The relative link targets of Markdown `text` (`[a](b.md#part)` gives
/// `b.md`); web addresses, mail addresses and links within the page are left
/// out.
fn link_targets(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| {
            let target = rest.split(')').next()?.split('#').next()?;
            let local = !target.is_empty()
                && !target.contains(char::is_whitespace)
                && !["http://", "https://", "mailto:"]
                    .iter()
                    .any(|scheme| target.starts_with(scheme));
            local.then(|| target.to_string())
        })
        .collect()
}

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
    for doc in docs(root) {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        for path in quoted_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{}: `{path}`", doc.display()));
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

#[test]
fn every_relative_link_of_the_docs_reaches_a_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in docs(root) {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let folder = root.join(&doc).parent().unwrap().to_path_buf();
        for target in link_targets(&text) {
            checked += 1;
            if !folder.join(&target).exists() {
                broken.push(format!("{}: ({target})", doc.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(
        broken.is_empty(),
        "the docs link files that do not exist:\n{}",
        broken.join("\n")
    );
}

#[test]
fn link_targets_takes_relative_links_only() {
    let text = "[a](docs/bench/serving.md), ![plot](../long_context.svg), \
                [part](#headlines), [b](BENCHMARKS.md#speculative-decoding), \
                [web](https://example.com/x.md) and [x] (not a link)";
    assert_eq!(
        link_targets(text),
        [
            "docs/bench/serving.md",
            "../long_context.svg",
            "BENCHMARKS.md"
        ]
    );
}

/// The documents a reader meets: [`docs`] without the diary, plus each
/// top-level folder's `README.md` and `BENCHMARKS.md` (`policies/BENCHMARKS.md`).
fn reader_docs(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = docs(root)
        .into_iter()
        .filter(|doc| !doc.starts_with("docs/journal"))
        .collect();
    for entry in std::fs::read_dir(root).unwrap() {
        let folder = PathBuf::from(entry.unwrap().file_name());
        let hidden = folder.to_string_lossy().starts_with('.');
        if hidden || folder == Path::new("target") || !root.join(&folder).is_dir() {
            continue;
        }
        for name in ["README.md", "BENCHMARKS.md"] {
            if root.join(&folder).join(name).is_file() {
                found.push(folder.join(name));
            }
        }
    }
    found.sort();
    found
}

/// Where `text` cites an issue by number ("issue 34", "Issues #12", "issue
/// 41's"), as the lines that do.
fn issue_citations(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| {
            let lower = line.to_lowercase();
            lower.match_indices("issue").any(|(at, word)| {
                let rest = lower[at + word.len()..].trim_start_matches('s');
                let rest = rest.strip_prefix(' ').unwrap_or(rest);
                let rest = rest.strip_prefix('#').unwrap_or(rest);
                rest.starts_with(|c: char| c.is_ascii_digit())
            })
        })
        .map(|line| line.trim().to_string())
        .collect()
}

#[test]
fn no_doc_cites_an_issue_number() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checked = reader_docs(root);
    assert!(
        checked.len() > 10,
        "only {} documents found: is the walk broken?",
        checked.len()
    );
    let mut cited = Vec::new();
    for doc in checked {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        for line in issue_citations(&text) {
            cited.push(format!("{}: {line}", doc.display()));
        }
    }
    assert!(
        cited.is_empty(),
        "the docs cite issue numbers; say what is true instead:\n{}",
        cited.join("\n")
    );
}

#[test]
fn issue_citations_finds_numbered_issues_only() {
    let text = "The backend (issue 34): x\nas Issues #12 and 13 asked\nissue 41's goal\n\
                an issue with the cache\nthe issuer 7\nissues: none";
    assert_eq!(
        issue_citations(text),
        [
            "The backend (issue 34): x",
            "as Issues #12 and 13 asked",
            "issue 41's goal"
        ]
    );
}
