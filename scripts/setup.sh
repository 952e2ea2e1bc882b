#!/usr/bin/env bash
# Installs what the tests need on a fresh machine: a Python virtual
# environment with the reference's packages (./.venv) and the real test model
# and Gemma 3 (cached by scripts/fetch-model.sh, scripts/fetch-gemma3.sh).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r tests/python/requirements.txt
scripts/fetch-model.sh >/dev/null
scripts/fetch-gemma3.sh >/dev/null
# The tokenizer checks compare against llama.cpp (built from source, AMX off).
scripts/install-llama-cpp.sh
echo "setup: .venv ready, test models at $(scripts/fetch-model.sh) and $(scripts/fetch-gemma3.sh)"
