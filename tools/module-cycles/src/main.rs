//! `module-cycles`: checks every library and binary of the workspace for module cycles
//! (see the library's documentation for what counts as a use). Prints each target, and
//! for one with cycles each cycle as a chain of modules; exits 1 if any has one, 2 if
//! the workspace cannot be read.
//!
//!   cargo run --release -p switchyard-module-cycles

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use serde_json::Value;

fn main() -> ExitCode {
    let targets = match workspace_targets() {
        Ok(targets) => targets,
        Err(error) => {
            eprintln!("module-cycles: {error}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for target in targets {
        match switchyard_module_cycles::find_cycles(&target.root) {
            Ok(cycles) if cycles.is_empty() => println!("ok: {}", target.label),
            Ok(cycles) => {
                failed = true;
                println!("CYCLE: {}", target.label);
                for cycle in cycles {
                    for line in cycle.to_string().lines() {
                        println!("    {line}");
                    }
                }
            }
            Err(error) => {
                failed = true;
                println!("ERROR: {}: {error}", target.label);
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A library or binary of a workspace package.
struct Target {
    /// `package (kind name)`.
    label: String,
    /// Its root source file.
    root: PathBuf,
}

/// Every library and binary target of the workspace's own packages (benches, tests
/// and examples are not checked), from `cargo metadata`.
fn workspace_targets() -> Result<Vec<Target>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
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
