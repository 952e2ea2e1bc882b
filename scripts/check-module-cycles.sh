#!/usr/bin/env bash
# Checks that no crate of the workspace has a module cycle beyond those listed in
# scripts/module-cycles.known (a list that only shrinks): within each library and
# binary, the uses between modules must all point one way. Prints each target, and
# each cycle in it as a chain of modules; exits non-zero on a new cycle or on a listed
# one that is gone.
#
#   scripts/check-module-cycles.sh
#
# The checker is tools/module-cycles (syn reading the source files; see its lib.rs for
# what counts as a use). `cargo test --workspace` runs the same check
# (tools/module-cycles/tests/workspace.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo run --release --locked -q -p switchyard-module-cycles -- --known scripts/module-cycles.known
