//! The check itself, as part of the test suite: no module cycle in any crate of this
//! workspace beyond those listed in `scripts/module-cycles.known`, which only shrinks.

use std::path::Path;

use switchyard_module_cycles::workspace::{check, targets};

#[test]
fn no_new_module_cycle_in_the_workspace() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let known = std::fs::read_to_string(root.join("scripts/module-cycles.known"))
        .expect("scripts/module-cycles.known is readable");
    let targets = targets(&root.join("Cargo.toml")).expect("cargo metadata runs");
    assert!(targets.len() > 5, "{targets:?}");
    let report = check(&targets, &known);
    assert!(!report.failed, "{}", report.lines.join("\n"));
}

#[test]
fn the_known_list_is_a_ratchet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = switchyard_module_cycles::workspace::Target {
        label: "checker (lib)".to_owned(),
        root: root.join("src/lib.rs"),
    };
    let clean = check(std::slice::from_ref(&target), "");
    assert!(!clean.failed, "{:?}", clean.lines);
    // A listed cycle that is not there fails, so the list cannot go stale.
    let stale = check(&[target], "# comment\nchecker (lib): crate::a, crate::b\n");
    assert!(stale.failed);
    assert!(
        stale.lines.iter().any(|line| line.starts_with("GONE:")),
        "{:?}",
        stale.lines
    );
}
