#!/usr/bin/env bash
# Soak test: mixed traffic over the demo repository's checkpoints with version flips,
# rollbacks, corrupt loads and policy reloads (tests/python/soak.py), for SECONDS
# (default 600). Prints a JSON line per checkpoint and a summary; exits non-zero on
# any failed or mixed request, or memory growth past the bound in soak.py.
#
#   scripts/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
[ -x target/release/switchyard ] || cargo build --release --locked
SWITCHYARD_BIN="${SWITCHYARD_BIN:-$PWD/target/release/switchyard}" \
    .venv/bin/python tests/python/soak.py --seconds "$seconds"
