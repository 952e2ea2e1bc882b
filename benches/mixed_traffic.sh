#!/usr/bin/env bash
# Mixed traffic (issue 4): the same streaming load sent to one checkpoint,
# then spread evenly over four resident checkpoints of one architecture (the
# demo repository's SmolLM2 base and its three derived checkpoints, which
# share every tensor but two), measured back to back in one run, twice in
# alternating order so that drift in the machine's load shows.
#
#   benches/mixed_traffic.sh [CLIENTS] [SECONDS]     (default: 16,64 and 20)
#
# Needs a release build (cargo build --release) and the test model
# (scripts/fetch-model.sh). Prints Markdown table rows from the load bench.
set -euo pipefail
cd "$(dirname "$0")/.."
clients="${1:-16,64}"
seconds="${2:-20}"
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/switchyard"
repo="${SWITCHYARD_DEMO_REPO:-$HOME/.cache/switchyard/demo-repo}"
port=18500

[[ -d "$repo/smollm2-derived-c" ]] || "$bin" demo-repo "$repo" --base "$(scripts/fetch-model.sh)"

log=/tmp/switchyard-mixed-traffic.log
"$bin" serve --repo "$repo" --listen "127.0.0.1:$port" > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
  if ! kill -0 $server 2>/dev/null; then
    echo "the server exited; its log ($log):" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  sleep 0.5
done

single=smollm2
mixed=smollm2,smollm2-derived-a,smollm2-derived-b,smollm2-derived-c
run() {
  echo "== $1 ($2)"
  cargo bench --quiet --bench load -- --url "http://127.0.0.1:$port" --model "$2" \
    --clients "$clients" --seconds "$seconds"
}
run single "$single"
run mixed "$mixed"
run mixed "$mixed"
run single "$single"
echo "== resident memory, swaps, steps per checkpoint"
curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^switchyard_(memory_bytes|swaps_total|steps_total)' || true
