//! The check over a whole workspace: every library and binary target, against a list
//! of cycles already known.
//!
//! The known list is a ratchet: a known cycle does not fail the check, a new one does,
//! and so does a known one that is gone (strike it from the list), so the list only
//! shrinks. Each line is a target and the modules of one cycle, as the report prints
//! them: `switchyard-engine (lib switchyard_engine): crate::a, crate::a::b`. Blank lines
//! and lines starting with `#` are comments.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::find_cycles;

/// A library or binary of a workspace package.
#[derive(Debug, Clone)]
pub struct Target {
    /// `package (kind name)`.
    pub label: String,
    /// Its root source file.
    pub root: PathBuf,
}

/// What the check found: a line per target and per cycle, and whether it failed.
#[derive(Debug, Default)]
pub struct Report {
    /// What to print, in order.
    pub lines: Vec<String>,
    /// A new cycle, a known one gone, or a target that could not be read.
    pub failed: bool,
}

/// Every library and binary target of the packages of the workspace at `manifest`
/// (its `Cargo.toml`), from `cargo metadata` (benches, tests and examples are not
/// checked).
pub fn targets(manifest: &Path) -> Result<Vec<Target>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(manifest)
        .output()
        .map_err(|error| format!("cannot run cargo metadata: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|error| format!("cannot read cargo metadata: {error}"))?;
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let package_name = package["name"].as_str().unwrap_or("?");
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds = target["kind"].as_array().into_iter().flatten();
            let Some(kind) = kinds
                .filter_map(Value::as_str)
                .find(|kind| matches!(*kind, "lib" | "bin" | "proc-macro"))
            else {
                continue;
            };
            let (Some(name), Some(root)) = (target["name"].as_str(), target["src_path"].as_str())
            else {
                continue;
            };
            targets.push(Target {
                label: format!("{package_name} ({kind} {name})"),
                root: PathBuf::from(root),
            });
        }
    }
    Ok(targets)
}

/// Checks every target against the `known` list (the file's text).
pub fn check(targets: &[Target], known: &str) -> Report {
    let mut expected: BTreeSet<String> = known
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let mut report = Report::default();
    for target in targets {
        let cycles = match find_cycles(&target.root) {
            Ok(cycles) => cycles,
            Err(error) => {
                report.failed = true;
                report
                    .lines
                    .push(format!("ERROR: {}: {error}", target.label));
                continue;
            }
        };
        if cycles.is_empty() {
            report.lines.push(format!("ok: {}", target.label));
        }
        for cycle in cycles {
            let key = format!("{}: {}", target.label, cycle.modules.join(", "));
            let verdict = if expected.remove(&key) {
                "known cycle (to break)"
            } else {
                report.failed = true;
                "CYCLE"
            };
            report.lines.push(format!("{verdict}: {}", target.label));
            for line in cycle.to_string().lines() {
                report.lines.push(format!("    {line}"));
            }
        }
    }
    for gone in expected {
        report.failed = true;
        report.lines.push(format!(
            "GONE: no longer a cycle; strike it from the known list: {gone}"
        ));
    }
    report
}
