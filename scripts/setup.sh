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
# The deploy/ tests: helm, and the Gateway API schemas for the HTTPRoute.
scripts/install-deploy-tools.sh >/dev/null
echo "setup: .venv ready, test model at $(scripts/fetch-model.sh)"
