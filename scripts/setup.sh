#!/usr/bin/env bash
# Installs what the tests need on a fresh machine: a Python virtual
# environment with the reference's packages (./.venv) and the real test model
# (cached by scripts/fetch-model.sh). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r tests/python/requirements.txt
scripts/fetch-model.sh >/dev/null
# The tokenizer checks compare against llama.cpp (built from source, AMX off).
scripts/install-llama-cpp.sh
# Fuzzing (scripts/fuzz.sh) and supply-chain checks (scripts/audit.sh).
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
cargo deny --version >/dev/null 2>&1 || cargo install cargo-deny --locked
echo "setup: .venv ready, test model at $(scripts/fetch-model.sh)"
