#!/usr/bin/env bash
# The policy layer bench run several times, summarized: for each case, the median and
# range over the runs of each run's p50 and p99 (wall clock, requests the scheduler did
# not switch out).
#
# On a shared host one run's p99 depends on how fast the host was during its few
# seconds; the median over runs is the figure BENCHMARKS.md reports, with the range.
# Pass a second binary to alternate two builds run for run (before/after comparisons:
# build the other commit with this bench file copied in and pass its bench executable).
#
# Usage: scripts/policy-layer-runs.sh [RUNS] [OTHER_BENCH_BINARY]   (default 10 runs)
# Pinned to CPU 1 (`CPU=0` to change).
# `STORES="memory embedded redis://127.0.0.1:6379"` instead alternates this build over
# those spend ledgers run for run (POLICY_LAYER_LEDGER; a Redis must be running), and
# reads the table of every request (a settlement that waits for the disk switches
# its thread out, so the "not switched out" table would drop exactly those).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
other="${2:-}"
cpu="${CPU:-1}"
# THIS_BENCH names this build's bench executable instead (one built elsewhere, say
# while this tree's target is busy).
bin="${THIS_BENCH:-$(cargo bench -p switchyard-router --bench policy_layer --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*policy_layer-[^"]*\)".*/\1/p' | tail -1)}"
if [[ -z "$bin" ]]; then
  echo "could not build the policy_layer bench; run cargo bench -p switchyard-router --bench policy_layer --no-run to see why" >&2
  exit 1
fi
# Each build: a name, a bench binary and the spend ledger it counts budgets in.
declare -a builds=("this $bin memory")
if [[ -n "$other" ]]; then
  [[ -x "$other" ]] || { echo "$other is not an executable bench binary" >&2; exit 1; }
  builds=("other $other memory" "this $bin memory")
fi
if [[ -n "${STORES:-}" ]]; then
  builds=()
  for store in $STORES; do builds+=("${store%%:*} $bin $store"); done
fi
table="wall clock, requests the scheduler did not switch out:"
if [[ -n "${STORES:-}" ]]; then table="wall clock:"; fi
rows="$(mktemp)"
trap 'rm -f "$rows"' EXIT
for ((run = 1; run <= runs; run++)); do
  for build in "${builds[@]}"; do
    read -r name executable store <<<"$build"
    POLICY_LAYER_LEDGER="$store" taskset -c "$cpu" "$executable" --bench 2>&1 \
      | awk -v want="$table" '$0 == want { table = 1; next }
             table && /whole-request difference/ { exit }
             table && /^\| / && !/^\| (case|---)/ { print }' \
      | sed "s/^/$name /" >>"$rows"
  done
  echo "run $run of $runs done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
python3 - "$rows" <<'EOF'
import re
import statistics
import sys

cases = {}
for line in open(sys.argv[1]):
    build, rest = line.split(" ", 1)
    case = rest.split("|")[1].strip()
    p50, p99 = (float(x) for x in re.findall(r"([\d.]+) µs", rest)[:2])
    cases.setdefault((case, build), []).append((p50, p99))

def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) µs"

print("| case | build | runs | p50 median (range) | p99 median (range) |")
print("| --- | --- | --- | --- | --- |")
order = list(dict.fromkeys(case for case, _ in cases))
for case, build in sorted(cases, key=lambda k: (order.index(k[0]), k[1] != "other")):
    samples = cases[(case, build)]
    p50s = [s[0] for s in samples]
    p99s = [s[1] for s in samples]
    print(f"| {case} | {build} | {len(samples)} | {spread(p50s)} | {spread(p99s)} |")

# The target (issue 5): the layer's own work under 20 µs at p99, in every run.
print()
for (case, build), samples in cases.items():
    if case.startswith("policy layer's own work"):
        over = sum(1 for _, p99 in samples if p99 >= 20.0)
        print(f"{build}: policy layer's own work p99 >= 20 µs in {over} of {len(samples)} runs")
EOF
