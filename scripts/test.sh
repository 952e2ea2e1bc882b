#!/usr/bin/env bash
# The project's test command: Rust unit and integration tests (the module-cycle
# check among them, tools/module-cycles/tests/workspace.rs), then the
# Python checks against the real binary (numerics against the NumPy
# reference, tokenization against an independent tokenizer).
# Run scripts/setup.sh once first.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked
cargo test --release --locked --workspace
SWITCHYARD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/switchyard" .venv/bin/python -m pytest -q tests/python "$@"
