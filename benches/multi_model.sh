#!/usr/bin/env bash
# The multi-model benchmark (issue 19): Switchyard's one engine serving K
# checkpoints against dedicated replicas behind a by-model proxy and against
# one process restarted on switch (llama-swap's way), Switchyard and
# llama.cpp's llama-server alike, on the same schedules in one run; then one
# model against llama-server at 1..64 streaming clients. Writes the plots and
# report.md to OUT (default target/multi-model) and prints the report.
#
#   benches/multi_model.sh [OUT] [-- extra `loadgen suite` flags]
#   benches/multi_model.sh --quick        (K=2,4 at one rate, 16 clients: ~10 min)
#   benches/multi_model.sh OUT -- --k 2,4,8  (K = 8 too)
#
# llama-server rows need scripts/build-llama-server.sh run once (slow; kept
# out of setup and CI); without the binary they are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=()
if [[ "${1:-}" == "--quick" ]]; then
  quick=(--k 2,4 --rates 1 --seconds 30 --clients 16 --client-seconds 20)
  shift
fi
out="${1:-target/multi-model}"
shift || true
[[ "${1:-}" == "--" ]] && shift

cargo build --release -p switchyard -p switchyard-loadgen --bins >&2
target="${CARGO_TARGET_DIR:-$PWD/target}"
cache="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
repo="$cache/demo-repo"
smollm2="$(scripts/fetch-model.sh)"
gemma3="$(scripts/fetch-gemma3.sh)"
# SmolLM2's Q8_0 re-quantization and five derived checkpoints (base plus a
# seeded low-rank delta on two matrices: not trained models), so K = 8 has
# eight checkpoints that really differ.
[[ -d "$repo/smollm2-derived-e" ]] || "$target/release/switchyard" demo-repo "$repo" --base "$smollm2" --derived 5 >&2
gguf() { find "$repo/$1" -name '*.gguf' | head -1; }

llama=()
if [[ -x "$target/llama-server/build/bin/llama-server" ]]; then
  llama=(--llama-server "$target/llama-server/build/bin/llama-server")
else
  echo "multi_model: no llama-server (scripts/build-llama-server.sh); its rows are left out" >&2
fi

mkdir -p "$out"
"$target/release/loadgen" suite --out "$out" --switchyard "$target/release/switchyard" "${llama[@]}" \
  --checkpoint "smollm2-q4_1=$smollm2" \
  --checkpoint "smollm2-q8_0=$(gguf smollm2/2)" \
  --checkpoint "gemma3-q4_k_m=$gemma3" \
  --checkpoint "smollm2-derived-a=$(gguf smollm2-derived-a)" \
  --checkpoint "smollm2-derived-b=$(gguf smollm2-derived-b)" \
  --checkpoint "smollm2-derived-c=$(gguf smollm2-derived-c)" \
  --checkpoint "smollm2-derived-d=$(gguf smollm2-derived-d)" \
  --checkpoint "smollm2-derived-e=$(gguf smollm2-derived-e)" \
  "${quick[@]}" "$@"
cat "$out/report.md"
