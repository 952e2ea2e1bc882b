//! `switchyard-module-cycles [--known FILE]`: checks every library and binary of the
//! workspace for module cycles (see the library's documentation for what counts as a
//! use), against the cycles listed in FILE (see `workspace.rs`). Prints each target, and
//! for each cycle its modules and one way round; exits 1 on a new cycle or a known one
//! gone, 2 when the workspace or the list cannot be read.
//!
//!   cargo run --release -p switchyard-module-cycles -- --known scripts/module-cycles.known

use std::path::Path;
use std::process::ExitCode;

use switchyard_module_cycles::workspace;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let known = match args.as_slice() {
        [] => String::new(),
        [flag, file] if flag == "--known" => match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("module-cycles: cannot read {file}: {error}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: switchyard-module-cycles [--known FILE]");
            return ExitCode::from(2);
        }
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let targets = match workspace::targets(&manifest) {
        Ok(targets) => targets,
        Err(error) => {
            eprintln!("module-cycles: {error}");
            return ExitCode::from(2);
        }
    };
    let report = workspace::check(&targets, &known);
    for line in &report.lines {
        println!("{line}");
    }
    if report.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
