#!/usr/bin/env bash
# Instructions per request of the policy layer, counted by callgrind (noise-free).
#
# Drives router/benches/policy_layer_calls.rs under callgrind for the policy app, the
# pass-through app and routing alone, counting only the measured batch (after a
# warm-up), and prints instructions per request and the difference. The callgrind
# files stay in $OUT_DIR (default target dir/callgrind) for callgrind_annotate.
#
# Usage: scripts/policy-callgrind.sh [REQUESTS]   (default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
requests="${1:-1000}"
target="${CARGO_TARGET_DIR:-target}"
out="${OUT_DIR:-$target/callgrind}"
mkdir -p "$out"
bin="$(cargo bench -p switchyard-router --bench policy_layer_calls --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*policy_layer_calls[^"]*\)".*/\1/p' | tail -1)"
if [[ -z "$bin" ]]; then
  echo "could not build the policy_layer_calls bench; run cargo bench -p switchyard-router --bench policy_layer_calls --no-run to see why" >&2
  exit 1
fi
declare -A per
for app in policy passthrough route; do
  file="$out/callgrind.$app.out"
  POLICY_CALLS_APP=$app POLICY_CALLS_REQUESTS=$requests \
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='policy_layer_calls::measured*' \
      --callgrind-out-file="$file" "$bin" >/dev/null 2>"$out/valgrind.$app.log"
  total=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p;s/^totals: *\([0-9]*\).*/\1/p' "$file" | tail -1)
  per[$app]=$((total / requests))
  printf '%-12s %12d instructions per request (%s requests, %s)\n' "$app" "${per[$app]}" "$requests" "$file"
done
printf '%-12s %12d instructions per request (policy - passthrough)\n' "layer" $((per[policy] - per[passthrough]))
